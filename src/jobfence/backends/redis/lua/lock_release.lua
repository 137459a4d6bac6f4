-- jobfence Redis lock backend: release, with hand-off (lock_lib.lua is prepended; its
-- release() says what a release does and returns).
--
-- KEYS[1] L = S:lock:{N}   (L..":tok", L..":q", L..":qd", L..":qf", L..":w:"..owner derived)
-- ARGV[1] owner
-- ARGV[2] absent; or "force" to drop the lease whoever holds it (administrative)
--
-- Returns 1 if the lease was released, 0 if owner did not hold it (nothing is changed).
return release(KEYS[1], ARGV[1], ARGV[2] == 'force')
