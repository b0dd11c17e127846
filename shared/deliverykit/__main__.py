"""``python -m deliverykit ...``"""

import sys

from .tools.commands import main

sys.exit(main())
