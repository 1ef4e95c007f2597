"""hvdcomp: gradient compression for Horovod (Marsit, BinSGDM, bidirectional Top-K, Sketch-Fusion)."""
from setuptools import find_packages, setup

setup(
    name="hvdcomp",
    version="0.2.0",
    description="Horovod-compatible gradient compression: Marsit, BinSGDM, bidirectional Top-K, Sketch-Fusion",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["hvdcomp", "hvdcomp.*"]),
    # The two stacks scripts/setup.sh builds and the suite runs on: the current one (numpy 2.x,
    # torch 2.14, TensorFlow 2.21, mpi4py 4) and the 2023 one (numpy 1.x, torch 2.13, TF 2.15).
    python_requires=">=3.11",
    install_requires=["numpy>=1.23,<3", "mpi4py>=3.1"],
    # Frameworks for a new environment (pip install "./hvdcomp[torch]"), within the stacks the
    # tests run on (tests/test_stack.py); an environment whose Horovod was built against its
    # torch / TensorFlow installs without extras. scripts/setup.sh installs the stack itself.
    extras_require={
        "torch": ["torch>=2.13,<2.15"],
        "tensorflow": ["tensorflow-cpu>=2.15,<2.22"],
        "dev": ["pytest>=7", "pytest-timeout", "scikit-learn", "matplotlib"],
    },
)
