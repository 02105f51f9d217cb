from slotserve.cli import main

raise SystemExit(main())
