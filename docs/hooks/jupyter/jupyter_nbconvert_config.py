# Jupyter reads this (JUPYTER_CONFIG_PATH, set by the nox docs sessions) when mkdocs-jupyter runs
# the exercise notebooks: their kernels talk over local IPC sockets in the temporary directory,
# not over TCP on loopback, which ipykernel warns about on every start.
import os
import tempfile

c = get_config()  # type: ignore[name-defined]  # noqa: F821
c.KernelManager.transport = "ipc"
c.KernelManager.ip = os.path.join(tempfile.gettempdir(), f"attention-kernel-{os.getpid()}")
