"""``python -m proxy.workers``: one worker process, as the supervisor starts it. Its modules
are imported after ``leave_out_test_tools``, as the CLI's commands import theirs."""

import sys

from proxy.cli import leave_out_test_tools

if __name__ == "__main__":
    leave_out_test_tools()
    from proxy.workers.worker import main  # imports kio, which must come after

    sys.exit(main())
