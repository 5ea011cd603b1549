"""compose/: the file checked without Docker (test_compose_file.py, in the default suite), and the stack built and
run for real (the other modules, opt-in: --run-compose)."""
