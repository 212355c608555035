import sys

from stepledger.cli.main import main

sys.exit(main())
