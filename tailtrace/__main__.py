import sys

from tailtrace.cli import main

sys.exit(main())
