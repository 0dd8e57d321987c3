import sys

from scheduler.process import main

sys.exit(main())
