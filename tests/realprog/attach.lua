-- scripts/realprog.sh's attached run of lua: probekit trace -p attaches
-- while this waits in its first read, and detaches while it waits in the
-- second.  Each wait writes "waiting" first.  The first line read decides
-- whether the workload (work.lua, path in the first argument) runs (a line
-- of 2 bytes: yes, 3: no); then lines are read while they have 5 bytes.
-- So the calls between the two waits are the workload's plus one wait's,
-- which the counter's runs give as (run, end) + (skip, more, end) -
-- 2 x (skip, end): the start-up, the exit and the other waits cancel.  The
-- lines are words no run has interned before (one new string each); the
-- lengths are compared, not the words (no call); the collector is stopped
-- (its cycles would come where each run's allocations put them); and
-- os.exit() leaves without closing the state (whose frees would be those
-- of each run's heap).
collectgarbage("stop")
local work = arg[1]
local function wait()
	io.write("waiting\n")
	io.flush()
	return io.read("l")
end
if #wait() == 2 then
	arg = {[0] = work, "1"}
	dofile(work)
end
while #wait() == 5 do end
os.exit(0)
