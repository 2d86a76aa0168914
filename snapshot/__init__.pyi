"""The types of ``snapshot``'s lazy submodules (``snapshot/__init__.py`` loads each on first use
through its module ``__getattr__``; a type checker reads this stub instead, and sees them
as the modules they are). tests/repo/test_lazy_stubs.py keeps the list whole."""
from . import backend as backend
from . import backends as backends
from . import candidates as candidates
from . import choose as choose
from . import conformance as conformance
from . import diskcap as diskcap
from . import errors as errors
from . import extras as extras
from . import fusefs as fusefs
from . import idmap as idmap
from . import layers as layers
from . import lazy as lazy
from . import osutil as osutil
from . import restore as restore
from . import store as store
from . import transaction as transaction
from . import tree as tree

def __getattr__(name: str) -> object: ...
