"""``python -m cursorsync``, and the file spark-submit runs as the job's driver
(``spark-submit .../cursorsync/__main__.py run -c FILE``)."""

from cursorsync.app.cli import main

if __name__ == "__main__":
    main()
