from interq.cli import main

raise SystemExit(main())
