"""The Horovod facade: what Horovod calls (the ``Compressor`` protocol: ``compress``,
``decompress``, placeholders, the op read back, names read from Horovod's own frames through
``hvdcomp.facade.frontends``), and the check of the Horovod release it was written against
(``horovod_version``). ``compressor_class(Method)`` turns a method (``hvdcomp.methods.contract``) into the
class users pass as ``compression=``; ``hvdcomp.registry`` does it for every method."""
from hvdcomp.facade.compressor import BatchedCompressor, compressor_class, horovod_sums

__all__ = ["BatchedCompressor", "compressor_class", "horovod_sums"]
