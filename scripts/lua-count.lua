-- Deterministic per-call work of a Redis script, for comparing script versions on a loaded
-- machine (Redis CPU time per call is not steady there): the Lua VM instructions and the
-- function calls the script itself makes per call, counted with debug.sethook in stock Lua
-- 5.1 (Redis's Lua version), with an in-memory mock of redis.call/pcall (TIME, GET, MGET, SET,
-- PSETEX, PEXPIRE, EXISTS, DEL, GETRANGE, SETRANGE, the configuration hash's HMGET and
-- HINCRBY, and the lists' LRANGE, LINDEX, RPUSH, RPOP, LSET and LTRIM) whose own work is
-- left out: the general path (a refund, a reset, a configured key) counts too. It does not count what the
-- Redis commands or the reply's conversion cost: it complements INFO commandstats, never
-- replaces it. "__rand_int__" in KEY and ARGS is replaced by one of 100 keys, in turn.
--
-- A Redis Functions library (a script whose first line is "#!lua name=...", which calls
-- redis.register_function) is loaded once, as FUNCTION LOAD does, and its first registered
-- function is what each call runs: the counts are then the per-FCALL work alone.
--
-- usage: lua5.1 scripts/lua-count.lua SCRIPT CALLS KEY ARGS...   ('' for an empty argument)
-- e.g.   redis_bench library > /tmp/library.lua     (or: redis_bench script > /tmp/check.lua)
--        lua5.1 scripts/lua-count.lua /tmp/library.lua 2000 'turnstile:v1:{k__rand_int__}:f4' \
--          'check defaults 0 1' $'\n1.1.1000.1000000000 p'
local path, calls = arg[1], tonumber(arg[2])
local src = io.open(path):read('*a')
local db, clock = {}, 1796058000000000
redis = {}
local function cmd(name, ...)
  local a = {...}; name = string.upper(name)
  if name == 'TIME' then clock = clock + 1000; return {tostring(math.floor(clock / 1e6)), tostring(clock % 1e6)} end
  if name == 'GET' then local v = db[a[1]]; if v == nil then return false end; return v end
  if name == 'SET' then db[a[1]] = tostring(a[2]); return {ok = 'OK'} end
  if name == 'PSETEX' then db[a[1]] = tostring(a[3]); return {ok = 'OK'} end
  if name == "PEXPIRE" then return 1 end
  if name == 'EXISTS' then local n = 0; for i = 1, #a do if db[a[i]] then n = n + 1 end end; return n end
  if name == 'MGET' then local r = {}; for i = 1, #a do r[i] = db[a[i]] or false end; return r end
  -- Hashes (a configuration's): a table of fields; HMGET of an absent hash answers false.
  local function hash(k) local h = db[k]; if type(h) ~= 'table' then h = {}; db[k] = h end; return h end
  if name == 'HMGET' then local h, r = db[a[1]] or {}, {}; for i = 2, #a do r[i - 1] = h[a[i]] or false end; return r end
  if name == 'HINCRBY' then local h = hash(a[1]); h[a[2]] = tostring((tonumber(h[a[2]]) or 0) + a[3]); return tonumber(h[a[2]]) end
  if name == 'GETRANGE' then local v = db[a[1]]; if type(v) ~= 'string' then return '' end; return string.sub(v, a[2] + 1, a[3] + 1) end
  if name == 'SETRANGE' then local v = db[a[1]]; db[a[1]] = a[3] .. string.sub(v, #a[3] + 1); return #db[a[1]] end
  if name == 'RPOP' then local l = db[a[1]]; if type(l) ~= 'table' then return false end; return table.remove(l) or false end
  -- Lists (a sliding log's): indices from 0, -1 the last.
  local function list(k) local l = db[k]; if type(l) ~= 'table' then l = {}; db[k] = l end; return l end
  local function at(l, i) i = tonumber(i); if i < 0 then i = #l + i end; return i + 1 end
  if name == 'LRANGE' then local l, r = list(a[1]), {}; for i = at(l, a[2]), math.min(at(l, a[3]), #l) do r[#r + 1] = l[i] end; return r end
  if name == 'LINDEX' then local l = list(a[1]); return l[at(l, a[2])] or false end
  if name == 'RPUSH' then local l = list(a[1]); l[#l + 1] = a[2]; return #l end
  if name == 'LSET' then local l = list(a[1]); l[at(l, a[2])] = a[3]; return {ok = 'OK'} end
  if name == 'LTRIM' then local l, r = list(a[1]), {}; for i = at(l, a[2]), #l do r[#r + 1] = l[i] end; db[a[1]] = r; return {ok = 'OK'} end
  if name == 'DEL' then for i = 1, #a do db[a[i]] = nil end; return 1 end
  error('unmocked ' .. name)
end
redis.call = cmd
redis.pcall = cmd
redis.error_reply = function(m) return {err = m} end
local registered = nil
redis.register_function = function(name, fn)
  if type(name) == 'table' then fn = name.callback end
  registered = registered or fn
end
KEYS = {arg[3]}
local base = {}
for i = 4, #arg do base[#base + 1] = (arg[i] == "''") and '' or arg[i] end
local f = assert(loadstring((string.gsub(src, '^#![^\n]*', ''))))
local n, c = 0, 0
local library = string.find(src, '^#!lua') ~= nil
if library then f(); f = assert(registered, 'the library registered no function') end
local function run(k)
  KEYS[1] = (string.gsub(arg[3], '__rand_int__', k))
  ARGV = {}
  for i, v in ipairs(base) do ARGV[i] = (string.gsub(v, '__rand_int__', k)) end
  if library then return f(KEYS, ARGV) end
  return f()
end
for i = 1, 100 do run(string.format('%012d', i % 100)) end
-- Only the script's own work counts: instructions and calls made from the mock (and from
-- this harness) are left out.
local getinfo = debug.getinfo
local harness = '@' .. arg[0]
debug.sethook(function(e)
  local i = getinfo(2, 'S')
  -- A C function counts when the script called it (not the harness or the mock).
  if i and i.what == 'C' then i = getinfo(3, 'S') end
  if i and i.source ~= harness then
    if e == 'count' then n = n + 1 else c = c + 1 end
  end
end, 'c', 1)
for i = 1, calls do run(string.format('%012d', i % 100)) end
debug.sethook()
local r = run('x')
print(string.format('%s: %.0f VM instructions, %.1f calls per call; reply[1..8]=%s', path:match('[^/]+$'), n / calls, c / calls, table.concat({tostring(r[1]), tostring(r[2]), tostring(r[3] or ''), tostring(r[4] or ''), tostring(r[5] or ''), tostring(r[6] or ''), tostring(r[10] or '')}, ',')))
