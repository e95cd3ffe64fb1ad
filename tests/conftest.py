import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
