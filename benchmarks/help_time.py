"""How long a command takes to answer --help or refuse a bad flag, with
Keras' import made to fail (a `keras` and a `tensorflow` package on
PYTHONPATH that raise on import): the flags come from `keras_skipinit.spec`,
so these answers never wait for TensorFlow. `import keras` alone is timed
beside them, in the same run, for scale. Median of --repeats runs each.

    python benchmarks/help_time.py
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [("train.py --help", ["train.py", "--help"], 0), ("train.py --epochs=0", ["train.py", "--epochs=0"], 2),
         ("train.py --normalization=nope", ["train.py", "--normalization=nope"], 2),
         ("export --help", ["-m", "export", "--help"], 0),
         ("sweep --help", ["-m", "keras_skipinit.sweep", "--help"], 0),
         ("sweep --epochs=0", ["-m", "keras_skipinit.sweep", "--epochs=0"], 2),
         ("analysis --help", ["-m", "keras_skipinit.analysis", "--help"], 0)]


def timed(argv, env, status):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if proc.returncode != status:
        raise SystemExit(f"{argv}: exit {proc.returncode}, expected {status}:\n{proc.stderr[-2000:]}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as fake:
        for name in ("keras", "tensorflow"):
            os.makedirs(os.path.join(fake, name))
            with open(os.path.join(fake, name, "__init__.py"), "w") as f:
                f.write(f"raise ImportError('{name} was imported')\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([fake, ROOT]), "KERAS_BACKEND": "tensorflow"}
        rows = [(label, statistics.median(timed(argv, env, status) for _ in range(args.repeats)))
                for label, argv, status in CASES]
    plain = {**os.environ, "PYTHONPATH": ROOT}
    rows.append(("python -c 'import keras' (for scale)",
                 statistics.median(timed(["-c", "import keras"], plain, 0) for _ in range(args.repeats))))
    print(f"{'command (Keras import failing)':<40} median s")
    for label, seconds in rows:
        print(f"{label:<40} {seconds:8.2f}")


if __name__ == "__main__":
    main()
