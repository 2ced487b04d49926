-- turnstile: several checks of one client key decided in one atomic call (a batch, issue 27).
-- A process that has a call in flight for a (client key, policies) pair queues the pair's
-- further checks and sends them together once that call ends; batch decides them in their
-- order, each all-or-nothing over its policies, at one reading of the server's TIME: each
-- gets exactly the reply check (check.lua) would have given it, the checks sent alone one
-- after the other at that time. Nothing here decides: every check is decided by the
-- algorithms' one copy of the arithmetic (the FAST table of fast.lua), the all-or-nothing
-- rule of outcome.lua, or check's own decide (its fast path, else its general path).
--
-- Composed after check.lua: into the Redis Function library (registered as
-- <library>_batch) and into the EVALSHA script of batches (the check script's definitions,
-- this file, then `return batch(KEYS, ARGV)`).
--
-- KEYS[1] as check's: the client's state string.
-- ARGV[1] "<budget> check <unconfigured> <least TTL> <cost>,<cost>,...[ <time>]": check's
--         ARGV[1] with the costs of the batch's checks in their order (at least one; each
--         0 <= cost <= 2^53 - 1, 0 a query) where check has one cost, after the budget: the
--         most policy evaluations the call may make (checks times policies per check),
--         beyond which the checks left are not decided (below).
-- ARGV[2] and on: as check's, the policy sets.
--
-- Returns one flat list: for each check decided, in order, the count of values its reply
-- takes, then check's reply (check.lua's header gives it: the compact one, or the full
-- one) — or -1 then the text of check's error reply (each check's error is its own and, as
-- for check, changes nothing). The checks decided are the first ones: the first always,
-- then each while the evaluations so far and the check's fit the budget. The caller sends
-- the others again (nothing was done for them).
--
-- Two ways through:
-- - the common case (batch_fast): checks under the defaults' policy set of a key without
--   configuration (as fast.lua's fast_check takes it), no sliding log among them: the state
--   string is read once (one GET, one match), every check decided on the numbers the one
--   before it left (each policy's, kept as the string would keep them), and the string
--   written once (one PSETEX) with the state and TTL the last admitted check leaves;
-- - anything else, or what batch_fast leaves: each check decided by check's decide, one after
--   the other, reading and writing the state itself.

-- Parsed ARGV[1] texts: BATCHES[text] = {budget = the budget, flags = check's flags with cost
-- 0, the costs in order}. Texts with an explicit time are not kept; at most FLAGS_MAX are
-- (then the table starts over), as FLAGS in sets.lua.
local BATCHES, BATCH_COUNT = {}, 0

-- The costs of text ("<cost>,<cost>,...", digits only), or nil.
local function costs_of(text)
  local costs, from, size = {}, 1, #text
  while true do
    local digits, after = match(text, '^(%d+)()', from)
    local c = nat(digits)
    if not c then return nil end
    costs[#costs + 1] = c
    if after > size then return costs end
    if string.sub(text, after, after) ~= ',' then return nil end
    from = after + 1
  end
end

-- ARGV[1] of a batch (see above), or nil when it is malformed: only checks are batched.
local function batch_of(text)
  local budget, head, costs, tail = match(text, '^(%d+) (%l+ %l+ %d+ )([%d,]+)(.*)$')
  budget = nat(budget)
  if not budget or budget < 1 then return nil end
  local flags = flags_of(head .. '0' .. tail)
  costs = flags and flags[1] == 'check' and costs_of(costs)
  if not costs then return nil end
  local b = {budget = budget, flags = flags, costs = costs}
  if not flags.time then
    if BATCH_COUNT >= FLAGS_MAX then BATCHES, BATCH_COUNT = {}, 0 end
    BATCHES[text], BATCH_COUNT = b, BATCH_COUNT + 1
  end
  return b
end

-- The values of a set's policies in the state string, read once by batch_fast: its captures
-- of set.pat (digits, as stored), or a fresh key's zeros; nil when fast.lua's fast_check
-- would not decide from the string (another type at the key, a string under other policies
-- or parameters, a configuration).
local function batch_state(set, key)
  local raw = redis.pcall('GET', key)
  if raw then
    if raw.err then return nil end
    local caps = {match(raw, set.pat)}
    if not caps[1] then return nil end
    return caps
  end
  local cfg = cfgkey_of(key)
  if not cfg or redis.call('EXISTS', cfg) ~= 0 then return nil end
  local last, caps = set[set.count], {}
  for i = 1, last.fk + last.a.fields - 1 do caps[i] = 0 end
  return caps
end

-- Writes the state string at key as the checks batch_fast decided leave it: each policy's
-- line from its numbers in caps, with the TTL ttl (ms) of the last admission, at least
-- min_ttl — the PSETEX fast_check makes for that admission.
local function batch_write(set, key, caps, ttl, min_ttl)
  local value = '0'
  for j = 1, set.count do
    local p = set[j]
    local k = p.fk
    value = value .. format(p.fmt, caps[k], caps[k + 1], caps[k + 2])
  end
  if ttl < min_ttl then ttl = min_ttl end
  redis.call('PSETEX', key, format('%d', ttl), value)
end

-- One check of cost c decided as fast_check decides it, on the numbers in caps (at now),
-- its reply written at out[at + 1 ..] (the compact one, after its count of values): each
-- policy's arithmetic on its numbers, then, when every policy admits c > 0, the numbers
-- after the admission kept in caps (the line fast_check would write), else the
-- all-or-nothing rule. Returns whether it admitted c > 0 and the TTL its admission needs
-- (the largest reset_after); nil when the arithmetic declines the numbers (fast_check's nil:
-- nothing kept).
local function batch_one(set, caps, now, c, out, at)
  local count = set.count
  out[at + 1], out[at + 2] = #set.reply, -1 - now
  local all, most = true, 0
  for j = 1, count do
    local p = set[j]
    local k, o = p.fk, at + 1 + p.fo
    local u, na, nb = caps[k] + 0, caps[k + 1], caps[k + 2]
    local ok, reset, v1, v2, t = fast_policy(p, u, na, nb, now, c, out, o)
    if ok == nil then return nil end
    if reset > most then most = reset end
    if not ok then all = false end
    p.ok, p.o, p.u, p.na, p.nb, p.t, p.v1, p.v2 = ok, o, u, na, nb, t, v1, v2
  end
  if c == 0 then return false, 0 end
  if not all then
    if count > 1 then as_if_nothing_consumed(set, count, out, true) end
    return false, 0
  end
  for j = 1, count do
    local p = set[j]
    local k = p.fk
    caps[k], caps[k + 1] = p.t, p.v1
    if p.a.fields > 2 then caps[k + 2] = p.v2 end
  end
  return true, most
end

-- The common case (see above) for the checks costs (in order) of set's policies on the
-- state string at key at now, their replies written into out from its start, within budget
-- evaluations. Returns the index of the first check it did not decide (#costs + 1: none
-- left), the values written and the evaluations made. The state string is written once, if
-- anything was admitted, before it returns.
local function batch_fast(set, key, now, costs, budget, min_ttl, out)
  local caps = batch_state(set, key)
  if not caps then return 1, 0, 0 end
  local count, at, spent, ttl, i = set.count, 0, 0, nil, 1
  local size = #set.reply + 1
  while i <= #costs and (i == 1 or spent + count <= budget) do
    local admitted, most = batch_one(set, caps, now, costs[i], out, at)
    if admitted == nil then
      -- What this check wrote is not its reply: check's decide writes that.
      for j = at + 1, at + size do out[j] = nil end
      break
    end
    if admitted then ttl = most end
    at, spent, i = at + size, spent + count, i + 1
  end
  if ttl then batch_write(set, key, caps, ttl, min_ttl) end
  return i, at, spent
end

-- The most policy evaluations one check of the key can make on check's general path: the
-- largest policy set the call carries, plus the lines of the key's override (read from its
-- configuration hash, which the general path reads as well). More than the general path
-- makes, never less, whichever of them applies.
local function general_bound(ARGV, key)
  local most = 1
  for i = 2, #ARGV do
    local set = SETS[ARGV[i]] or set_of(ARGV[i])
    if set and set.count > most then most = set.count end
  end
  local cfg = cfgkey_of(key)
  local o = cfg and redis.pcall('HGET', cfg, 'o')
  if type(o) == 'string' then
    local _, breaks = string.gsub(o, '\n', '')
    most = most + breaks + 1
  end
  return most
end

-- Appends reply r (check's reply: a table of values, or an error reply) to out after at;
-- returns where it ends.
local function batch_put(out, at, r)
  if r.err then
    out[at + 1], out[at + 2] = -1, r.err
    return at + 2
  end
  local n = #r
  out[at + 1] = n
  for j = 1, n do out[at + 1 + j] = r[j] end
  return at + 1 + n
end

local function batch(KEYS, ARGV)
  if not match then bind() end
  local text, key = ARGV[1], KEYS[1]
  local b = BATCHES[text or false] or (text and batch_of(text))
  if not b or not key then
    return redis.error_reply('TURNSTILE_ARGS malformed arguments')
  end
  local flags, costs, budget = b.flags, b.costs, b.budget
  local now = flags.time or server_ms()
  local out, from, at, spent = {}, 1, 0, 0
  if flags.fast then
    local set = SETS[ARGV[2]] or (ARGV[2] and set_of(ARGV[2]))
    if set and set.defaults and not set.log then
      from, at, spent = batch_fast(set, key, now, costs, budget, flags[3], out)
    end
  end
  -- Each check left counts its general path's bound against the budget (a lone first check
  -- needs none: it is decided whatever its cost).
  local bound = 0
  if from <= #costs and #costs > 1 then bound = general_bound(ARGV, key) end
  -- One flags table for every check left (decide and general only read it), its cost set
  -- per check; not flags itself, which flags_of keeps for other calls.
  local one = {flags[1], flags[2], flags[3], time = flags.time, fast = flags.fast}
  for i = from, #costs do
    if i > 1 and spent + bound > budget then break end
    spent = spent + bound
    one.cost = costs[i]
    at = batch_put(out, at, decide(ARGV, key, one, now))
  end
  return out
end
