from lsan.cli import main

raise SystemExit(main())
