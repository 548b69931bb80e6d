"""The ``agui-hub`` command line (the top layer): the gateway (``serve``), the
clients' commands (``publish``, ``tail``, ``replay``, ``demo``, ``run``,
``cancel``, ``token``) and the operator commands (``threads``, ``info``,
``delete``, ``check``). ``main()`` is the console script's entry point.
"""

from .commands import main

__all__ = ["main"]
