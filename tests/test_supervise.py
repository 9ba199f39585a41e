"""txf.runtime.supervise, the parent of each process of a multi-process job: whatever order the child's own
error line and the runtime client's "the service is gone" lines come in, and however the child
ends (its own exit, an abort from inside jaxlib), the user sees one line and a resumable status.

The child here is a stand-in script (the parent's Popen is redirected to it in a subprocess), so
each ordering is produced exactly, which a real lost coordinator produces only by chance.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

GONE = "E0000 Polled an error from coordination service (this can be an error from this or another"
OWN = "txf: error: process 1 of 2 was stopped for 7 s, longer than TXF_HEARTBEAT_TIMEOUT=5 s"


def supervised(child_lines, child_end, tmp_path):
  """Run txf.supervise.supervise with a child that writes ``child_lines`` on stderr and then runs
  ``child_end`` (Python). Returns (parent's exit status, parent's stderr lines)."""
  child = tmp_path / "child.py"
  child.write_text("import os, sys\n" + "".join(
      f"sys.stderr.write({line!r} + '\\n'); sys.stderr.flush()\n" for line in child_lines)
                   + child_end + "\n")
  parent = textwrap.dedent(f"""
      import subprocess, sys
      from txf.runtime import supervise
      real = subprocess.Popen
      supervise.subprocess.Popen = lambda args, **kw: real([sys.executable, {str(child)!r}], **kw)
      supervise.supervise(["txf", "train"], {{"TXF_COORDINATOR": "127.0.0.1:1",
                                              "TXF_NUM_PROCESSES": "2", "TXF_PROCESS_ID": "1"}})
      """)
  done = subprocess.run([sys.executable, "-c", parent], cwd=ROOT, capture_output=True, text=True,
                        timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
  return done.returncode, done.stderr.splitlines()


@pytest.mark.parametrize("lines,end,status,said", [
    # the child said why it ends, then the service went and jaxlib aborted it: that line only
    ([OWN, GONE, "terminate called after throwing an instance of 'std::bad_cast'"], "os.abort()",
     75, [OWN]),
    # the service went first; the child's own line came after, and it exited itself
    ([GONE, OWN], "sys.exit(75)", 75, [OWN]),
    # the service went and the child was aborted without a word: the parent's line
    ([GONE, "*** SIGABRT received"], "os.abort()", 75,
     ["txf: error: lost process 0 (the coordinator) of 2: its coordination service is gone: run "
      "the same command again to resume"]),
    # an ordinary ending: everything passed through, the same status
    (["step 1", "txf: error: no such file: x.txt"], "sys.exit(2)", 2,
     ["step 1", "txf: error: no such file: x.txt"]),
])
def test_one_line_and_a_resumable_status_whatever_the_order(lines, end, status, said, tmp_path):
  got_status, got = supervised(lines, end, tmp_path)
  assert (got_status, got) == (status, said)
