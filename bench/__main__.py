"""``python -m bench [--configs small,base] [--output runs/bench.json] [--steps 5]``: see bench/run.py."""

from bench.run import main

if __name__ == "__main__":
  main()
