-- The lua workload of scripts/realprog.sh: work through the interpreter's
-- main paths (parser, VM, GC, strings and patterns, tables, closures,
-- coroutines, and error() / pcall, which the C code runs through longjmp),
-- deterministic, printing a checksum per part so that a traced run's output
-- can be compared with a plain one's.  usage: lua work.lua [SCALE]
local scale = tonumber(arg and arg[1]) or 1

local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end
print("fib", fib(18 + scale))

-- tables, sort with a Lua comparator (C calls back into the VM)
local t, seed = {}, 42
for i = 1, 4000 * scale do
	seed = (seed * 1103515245 + 12345) % 2147483648
	t[i] = seed
end
table.sort(t, function(a, b) return a > b end)
local s = 0
for i = 1, #t, 97 do s = (s + t[i]) % 1000000007 end
print("sort", s)

-- strings: format, gsub with a function, patterns, concat, rep
local parts = {}
for i = 1, 2000 * scale do parts[#parts + 1] = string.format("%d:%x:%5.2f", i, i * 7, i / 3) end
local text = table.concat(parts, ",")
local n = 0
text = text:gsub("(%d+):(%x+)", function(a, b) n = n + #a + #b; return b .. a end)
local words = 0
for w in text:gmatch("[%d%.]+") do words = words + 1 end
print("strings", #text, n, words, select(2, string.rep("ab", 1000):gsub("ba", "")))

-- closures and varargs
local function counter()
	local c = 0
	return function(...) c = c + select("#", ...); return c end
end
local acc = 0
for i = 1, 300 * scale do
	local f = counter()
	for j = 1, 10 do acc = acc + f(i, j, nil) end
end
print("closures", acc)

-- coroutines: a generator pipeline
local function gen(k)
	return coroutine.wrap(function() for i = 1, k do coroutine.yield(i) end end)
end
local function filter(src)
	return coroutine.wrap(function() for v in src do if v % 3 == 0 then coroutine.yield(v) end end end)
end
local cs = 0
for v in filter(gen(5000 * scale)) do cs = cs + v end
print("coroutines", cs)

-- errors: error() inside pcall longjmps out of the C stack of the VM,
-- also from nested C calls (string.gsub's callback, table.sort's comparator)
local caught = 0
for i = 1, 500 * scale do
	local ok, e = pcall(function() error({ code = i }) end)
	if not ok and e.code == i then caught = caught + 1 end
	ok = pcall(string.gsub, "abc", "%w", function() error("x") end)
	if not ok then caught = caught + 1 end
	ok = pcall(table.sort, { 3, 2, 1 }, function() error("y") end)
	if not ok then caught = caught + 1 end
end
local ok, msg = pcall(function() local x = nil; return x.y end)
print("errors", caught, ok, (msg:gsub("^.-:%d+: ", "")))

-- load: the parser and code generator on generated chunks
local lsum = 0
for i = 1, 200 * scale do
	local chunk = load("local a, b = ... ; local r = 0; for k = 1, a do r = r + k * b end; return r, '" .. i .. "'")
	local r = chunk(i, 2)
	lsum = lsum + r
end
print("load", lsum)

-- the garbage collector, full and incremental, and weak tables
-- (no table keys: they hash by address, which differs between runs)
local weak = setmetatable({}, { __mode = "v" })
for i = 1, 3000 * scale do weak[i] = {} end
collectgarbage("collect")
local left = 0
for _ in pairs(weak) do left = left + 1 end
collectgarbage("step", 100)
print("gc", left)

-- metatables: __index, __add, __call, __tostring
local V = {}
V.__index = V
V.__add = function(a, b) return setmetatable({ x = a.x + b.x }, V) end
V.__tostring = function(v) return "V(" .. v.x .. ")" end
local v = setmetatable({ x = 0 }, V)
for i = 1, 2000 * scale do v = v + setmetatable({ x = i }, V) end
print("meta", tostring(v))

-- utf8 and string.pack
local u = {}
for i = 1, 200 do u[#u + 1] = utf8.char(i * 37) end
local us = table.concat(u)
print("utf8", utf8.len(us), #string.pack("<i4i8z", 1, 2, "abc"))
