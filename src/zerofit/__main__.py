import sys

from zerofit.cli.main import main

sys.exit(main())
