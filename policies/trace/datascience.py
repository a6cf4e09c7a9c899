"""The data-science workload the allowlist's margin is checked against.

numpy, pandas, matplotlib and scikit-learn doing what an analysis step does:
BLAS and OpenMP thread pools, joblib worker processes, plots saved to files.
Run it with the packages importable (the data-science rootfs, or a folder of
wheels on sys.path) under `policies/trace/trace.sh`; it prints one JSON
object of section results.
"""

import json
import os
import sys
import tempfile

RESULTS = {}
SECTIONS = []


def section(fn):
    SECTIONS.append(fn)
    return fn


@section
def numpy_compute():
    import numpy as np
    rng = np.random.default_rng(0)
    a = rng.standard_normal((400, 400))
    b = a @ a.T
    np.linalg.eigh(b)
    np.linalg.svd(a[:100, :100])
    np.fft.fft(rng.standard_normal(4096))
    big = np.zeros(20_000_000)
    big[::1000] = 1
    big = np.resize(big, 30_000_000)
    assert big.sum() > 0
    np.save(os.path.join(WORK, "a.npy"), a)
    np.load(os.path.join(WORK, "a.npy"), mmap_mode="r").sum()


@section
def pandas_frames():
    import numpy as np
    import pandas as pd
    df = pd.DataFrame({"k": np.arange(100_000) % 17, "v": np.random.default_rng(1).random(100_000),
                       "t": pd.date_range("2020-01-01", periods=100_000, freq="min")})
    path = os.path.join(WORK, "d.csv")
    df.to_csv(path, index=False)
    back = pd.read_csv(path, parse_dates=["t"])
    g = back.groupby("k")["v"].agg(["mean", "std", "count"])
    assert len(g) == 17
    back.set_index("t").resample("1h")["v"].mean()
    back.describe()
    df.to_json(os.path.join(WORK, "d.json"))
    df.to_pickle(os.path.join(WORK, "d.pkl"))


@section
def matplotlib_plots():
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(WORK, "mpl"))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, ax = plt.subplots(1, 2, figsize=(8, 3))
    ax[0].plot(np.arange(100), np.sin(np.arange(100) / 10))
    ax[1].hist(np.random.default_rng(2).normal(size=1000), bins=30)
    ax[0].set_title("sine")
    for ext in ("png", "pdf", "svg"):
        fig.savefig(os.path.join(WORK, f"p.{ext}"))
    plt.close(fig)


@section
def sklearn_models():
    import numpy as np
    from sklearn.cluster import KMeans
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score, train_test_split
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2000, 10))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    xt, xv, yt, yv = train_test_split(x, y, random_state=0)
    LogisticRegression(max_iter=500).fit(xt, yt).score(xv, yv)
    RandomForestClassifier(n_estimators=20, n_jobs=2, random_state=0).fit(xt, yt).score(xv, yv)
    cross_val_score(RandomForestClassifier(n_estimators=10, random_state=0), x, y, cv=3, n_jobs=2)
    KMeans(n_clusters=3, n_init=2, random_state=0).fit(x)


@section
def scipy_and_images():
    import numpy as np
    from PIL import Image
    from scipy import optimize, sparse, stats
    optimize.minimize(lambda v: ((v - 1) ** 2).sum(), np.zeros(5))
    stats.ttest_ind(np.arange(10), np.arange(10) + 1)
    sparse.random(200, 200, density=0.01, format="csr") @ np.ones(200)
    Image.fromarray((np.random.default_rng(4).random((64, 64)) * 255).astype("uint8")).save(os.path.join(WORK, "i.png"))


def main():
    global WORK
    WORK = tempfile.mkdtemp(prefix="trace-ds-")
    for fn in SECTIONS:
        try:
            fn()
            RESULTS[fn.__name__] = "ok"
        except Exception as e:  # report every failure, keep going
            RESULTS[fn.__name__] = f"{type(e).__name__}: {e}"
    print(json.dumps(RESULTS))
    sys.exit(0 if all(v == "ok" for v in RESULTS.values()) else 1)


WORK = None
if __name__ == "__main__":
    main()
