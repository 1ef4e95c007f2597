# Environment for running MPI jobs on this kind of machine (sourced by demo.sh and test.sh):
# root is allowed to run mpirun, ranks yield when idle and use one thread each (2 cores here).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
# tf.keras as Keras 2 (tf-keras): Horovod's Keras front end needs it with TensorFlow >= 2.16.
export TF_USE_LEGACY_KERAS="${TF_USE_LEGACY_KERAS:-1}"
