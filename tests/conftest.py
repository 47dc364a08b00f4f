import atexit
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# The temporary files of this session (the run directories of compiles given none, the sandboxes', the processes'
# the tests start) go to a directory of its own, removed when it ends: a full run leaves thousands of them.
tempfile.tempdir = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="rlmopt-tests-")
atexit.register(shutil.rmtree, tempfile.tempdir, ignore_errors=True)
if "DSPY_CACHEDIR" not in os.environ:  # a cache of this session's own, removed when it ends
    os.environ["DSPY_CACHEDIR"] = tempfile.mkdtemp(prefix="rlmopt-dspy-cache-")
    atexit.register(shutil.rmtree, os.environ["DSPY_CACHEDIR"], ignore_errors=True)
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

import dspy  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _python_handles_ctrl_c():
    """Every test starts with Python's own Ctrl-C handler (it raises KeyboardInterrupt): a library an earlier test
    ran may leave one of its own installed, under which a simulated Ctrl-C (``_thread.interrupt_main``) is
    swallowed."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(autouse=True)
def _clean_dspy_settings():
    """Every test starts with no configured LM and leaves none behind."""
    with dspy.context(lm=None, trace=None):
        yield
