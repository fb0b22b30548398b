"""The study database: the tables (``schema``), the connections (``engine``), reads and writes
(``storage``), the moves of a study between states and its lease (``lifecycle``), the per-study summary
kept with each trial write (``summary``), the API's SQL-side reads (``queries``), progress lines
(``progress``) and the schema migrations (``migrations``). Imports ``tuner.study`` only."""
