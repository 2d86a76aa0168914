"""The types of ``merge``'s lazy submodules (``merge/__init__.py`` loads each on first use
through its module ``__getattr__``; a type checker reads this stub instead, and sees them
as the modules they are). tests/repo/test_lazy_stubs.py keeps the list whole."""
from . import changes as changes
from . import diffalgo as diffalgo
from . import errors as errors
from . import ignore as ignore
from . import journal as journal
from . import merge3 as merge3
from . import on_conflict as on_conflict
from . import patch as patch
from . import promote as promote
from . import replay as replay
from . import safefs as safefs

def __getattr__(name: str) -> object: ...
