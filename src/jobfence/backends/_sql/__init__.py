"""What the SQL backends share (no backend of its own): ``inbox_async`` (source) /
``inbox`` (generated), the inbox verbs that are one named statement each on PostgreSQL and
SQLite."""
