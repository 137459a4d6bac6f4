"""Private machinery shared by every part: clock, hooks, URL parsing and masking, validation,
options, the SQL/Lua loader, concurrency compat, connection pool, user-connection adapters."""
