"""``python -m txf.bench [--configs small,base] [--output runs/bench.json] [--steps 5]``: see txf/bench/run.py."""

from txf.bench.run import main

if __name__ == "__main__":
  main()
