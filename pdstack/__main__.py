import sys

from pdstack.cli import main

sys.exit(main())
