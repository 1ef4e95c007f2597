"""hvdcomp: gradient compression for Horovod (Marsit, BinSGDM, bidirectional Top-K, Sketch-Fusion)."""
from setuptools import find_packages, setup

setup(
    name="hvdcomp",
    version="0.1.0",
    description="Horovod-compatible gradient compression: Marsit, BinSGDM, bidirectional Top-K, Sketch-Fusion",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["hvdcomp", "hvdcomp.*"]),
    python_requires=">=3.9",
    install_requires=["numpy>=1.23,<2", "mpi4py>=3.1"],
    extras_require={
        "torch": ["torch==2.13.0"],
        "tensorflow": ["tensorflow-cpu>=2.15,<2.16"],
        "dev": ["pytest>=7", "pytest-timeout", "scikit-learn", "matplotlib"],
    },
)
