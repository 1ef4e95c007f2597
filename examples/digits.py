"""scikit-learn's bundled digits (1797 8x8 images, no download), read from the CSV file the
scikit-learn package ships, without importing scikit-learn: the same arrays as
``sklearn.datasets.load_digits()`` gives (``data``, ``target``), at a fraction of its import time
(about 2.5 s per process here, which every rank of every launch paid)."""
import importlib.util
import os

import numpy as np


def load_digits():
    """``(data, target)``: float64 of shape (1797, 64) with pixel values 0..16, and int64 labels
    of shape (1797,), as ``sklearn.datasets.load_digits()`` returns them."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ImportError("the digits data ships with scikit-learn: pip install scikit-learn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)
