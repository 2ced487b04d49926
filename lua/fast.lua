-- turnstile: the fast path of check (check.lua) for the common case: a check (not a refund or
-- a reset) under the defaults' policy set of a key whose state string (KEYS[1], see
-- states.lua) was written with no configuration (header '0') and holds exactly the set's
-- policies, in the set's order, each under its own parameters — or of a key with no state
-- string and no configuration hash (one EXISTS: a fresh key). It decides from locals: one
-- GET, one anchored match of the whole string against the set's pattern (the header, then
-- per policy its parameter text, exactly its algorithm's count of numbers, digits only, and
-- its name), each algorithm's arithmetic (the one every path calls: bucket.lua,
-- fixed_window.lua, sliding_window.lua, sliding_log.lua) writing straight into the reply,
-- and, when every policy admits a cost above 0, one PSETEX of the whole string with the
-- largest of the policies' TTLs. It creates no table (the reply is the set's, filled in
-- place) but, for several policies, the match's captures. A sliding log is decided here
-- only when it admits with nothing to prune (fast_log): its list's oldest entry read (and
-- its newest when the state was updated at the decision's time), then one entry written and
-- the list given the string's TTL.
--
-- Anything else — a header 'c' (the key has or had a configuration), a state under other
-- parameters (carried over), other policies, a string that is not a state, another type at
-- the key, numbers no request leaves, a sliding log's query, denial or expired entry —
-- makes fast_check return nil before anything is written, and check takes its general
-- path, which reads the state again and decides (or reports the invalid state). Every
-- decision here is the general path's: the same functions decide, on every state the
-- scripts leave; only how the state is found, parsed and written is the fast path's own.
-- (On a sliding log whose newest entry is garbage and its oldest not, the general path
-- reports it at once; fast_log, which need not read the newest, appends after it, and the
-- general path reports it when it reads it: a query, a denial, once the entries before it
-- expire.)

-- A set's policy made ready for the fast path (from spec_of): the anchored pattern of its
-- stored state (its parameter text, then exactly its algorithm's count of numbers), the
-- formats of its line, and its decision.
local FAST -- the algorithms' fast decisions by id (below)
local function fast_spec(p)
  -- The policy's line in the state string (states.lua): "\n<params>|<numbers>\t<name>", as a
  -- pattern (every character of the name that is not a letter or digit escaped) and as a
  -- format (a '%' of the name doubled); fmt0 with the header '0' before it (a set of one).
  -- Each made by one concatenation (with EVALSHA every call parses its set again).
  local n = p.a.fields
  p.pat = '\n' .. string.gsub(p.params, '%.', '%%.') .. string.rep('|(%d+)', n) .. '\t'
    .. string.gsub(p.name, '%W', '%%%0')
  p.fmt = '\n' .. p.params .. '|%d' .. string.rep('|%d', n - 1) .. '\t'
    .. string.gsub(p.name, '%%', '%%%%')
  p.fmt0 = '0' .. p.fmt
  p.fast = FAST[p.alg]
end

-- The entry at index i of the log at key ("digits:digits"): its time and cost, when the time
-- is at most updated (so at most 2^53 - 1) and the cost from 1 to total; else nil (anything
-- else, another type at the key included: the general path reads and reports it).
local function fast_entry(key, i, updated, total)
  local s = redis.pcall('LINDEX', key, i)
  if not s or s.err then return nil end
  local t, c = match(s, '^(%d+):(%d+)$')
  if not t then return nil end
  t, c = t + 0, c + 0
  if t > updated or c < 1 or c > total then return nil end
  return t, c
end

-- A sliding log's decision on the fast path, as FAST calls the others' (updated; total, as
-- stored; the unused third number; updated 0 and total 0: no state, as stored totals are
-- at least 1): decided here only when it admits c > 0 with nothing to prune (log_admits on
-- the total, and the oldest entry live), else nil (a query, a denial, an expired entry, no
-- log — the general path). It reads the oldest entry (LINDEX 0), checked as log_list.lua's
-- log_entry checks it; the newest (LINDEX -1) only when the state was updated at now: every
-- entry is at most the update's time, so only then can the newest be at now, which the
-- entry then grows (LSET); else a new one follows it (RPUSH). fast_check writes the log
-- once the whole set admits (p.entry, p.grow, p.nolog). Returns true, reset_after P, and
-- the total after.
local function fast_log(p, updated, total, _, now, c, out, o)
  total = total + 0
  local fresh = false
  if total < 1 then
    if updated ~= 0 then return nil end
    fresh = true
  end
  -- (log_admits bounds total by L - c, so by 2^32.)
  if not log_admits(p, total, c, out, o) then return nil end
  local grow = nil
  if not fresh then
    local t = fast_entry(p.logkey, 0, updated, total)
    if not t or now - t >= p.P then return nil end
    if updated == now then
      -- Updated at now: the newest entry (no later than the update) may be at now.
      local tc
      t, tc = fast_entry(p.logkey, -1, updated, total)
      if not t then return nil end
      if t == now then grow = tc + c end
    end
  end
  p.grow, p.nolog = grow, fresh
  p.entry = format('%d:%d', now, grow or c)
  return true, p.P, total + c
end

-- Where a state string's key ends before its format suffix (string.sub(key, 1, BASE_END) is
-- the key's base).
local BASE_END = -#FORMAT_SUFFIX - 1

-- The list of each of a set's sliding logs (logs, set.log) for the state string at key: the
-- key's base, then the policy's suffix.
local function fast_logkeys(logs, key)
  local base = string.sub(key, 1, BASE_END)
  for i = 1, #logs do
    local p = logs[i]
    p.logkey = base .. p.logsuffix
  end
end

-- Writes the log of each of a set's sliding logs (logs) as fast_log decided it (the whole
-- set admitted) and gives it the string's TTL ttl (text), as write_states does: a fresh
-- state's leftover log dropped first, then the entry at now grown or added.
local function fast_logs(logs, ttl)
  for i = 1, #logs do
    local p = logs[i]
    if p.nolog then redis.call('DEL', p.logkey) end
    if p.grow then
      redis.call('LSET', p.logkey, -1, p.entry)
    else
      redis.call('RPUSH', p.logkey, p.entry)
    end
    redis.call('PEXPIRE', p.logkey, ttl)
  end
end

-- The fast decisions by id: the algorithms' own arithmetic, called on the stored numbers as
-- (p, updated, a, b, now, c, out, o) and returning whether the policy admits, its
-- reset_after in ms and the numbers to store after updated when it admits c > 0; or nil
-- (numbers no request leaves, a sliding log fast_log leaves: the general path decides).
FAST = {bucket_decide, bucket_decide, bucket_decide, fixed_decide, fast_log, sliding_decide}

-- The state string of set's policies (two or more) once all admitted (each line made by
-- fast_check: p.value), made at once (for two or three policies one CONCAT of every piece).
local function fast_value(set, count)
  if count == 2 then return '0' .. set[1].value .. set[2].value end
  if count == 3 then return '0' .. set[1].value .. set[2].value .. set[3].value end
  local value = '0'
  for i = 1, count do value = value .. set[i].value end
  return value
end

-- Policy p of a fast set on its stored fields (updated u, then na and nb) at now for cost
-- c, its reply written into out from o: admitted (nil: not for this path), its reset, its
-- new fields, and the time it decided at (a clock earlier than updated decides at updated).
-- The one loop step of fast_check and of batch.lua's batch_one.
local function fast_policy(p, u, na, nb, now, c, out, o)
  local t = now
  if u > now then
    if u > MAX_EXACT then return nil end
    t = u
  end
  local ok, reset, v1, v2 = p.fast(p, u, na, nb, t, c, out, o)
  return ok, reset, v1, v2, t
end

-- The reply of a check of set's policies (set.fast: at most 32 numbers) on the state string
-- at key (KEYS[1]) at now for cost, or nil for the general path (nothing written then).
-- cfgkey(key) is the configuration hash's key, read only for a fresh key. The reply is the
-- compact one (check.lua's header): -1 - now (the defaults applied, version 0), then each
-- policy's values, in set.reply (see set_of). Every policy is decided first, on its numbers
-- in the string (the match's captures: for one policy as values, for more as a table; a
-- fresh key's are zeros), then the string is stored only if all admit, with the largest
-- TTL they need; else the all-or-nothing rule.
local function fast_check(set, key, now, cost, min_ttl, cfgkey)
  local count, caps, n1, n2, n3, value = set.count, set.none, 0, 0, 0, nil
  local raw = redis.pcall('GET', key)
  if raw then
    -- An error reply (another type at the key) is a table; a string's .err is nil (its
    -- metatable's index is the string library), without a call of type().
    if raw.err then return nil end
    if count == 1 then
      n1, n2, n3 = match(raw, set.pat)
      if not n1 then return nil end
    else
      caps = {match(raw, set.pat)}
      if not caps[1] then return nil end
    end
  else
    -- A fresh key: no configuration hash (and a key of the right form: nil, else).
    local cfg = cfgkey(key)
    if not cfg or redis.call('EXISTS', cfg) ~= 0 then return nil end
  end
  if set.log then fast_logkeys(set.log, key) end
  local out, all, most = set.reply, true, 0
  out[1] = -1 - now
  for i = 1, count do
    local p = set[i]
    local o = p.fo
    if count > 1 then
      local k = p.fk
      n1, n2, n3 = caps[k], caps[k + 1], caps[k + 2]
    end
    -- updated: digits only, so s + 0 reads them as nat does.
    local u = n1 + 0
    local ok, reset, v1, v2, t = fast_policy(p, u, n2, n3, now, cost, out, o)
    if ok == nil then return nil end
    if reset > most then most = reset end
    if not ok then
      all = false
    elseif cost > 0 then
      -- its line after the admission (a set of one's: the whole string, with the header)
      if count == 1 then
        value = format(p.fmt0, t, v1, v2)
      else
        p.value = format(p.fmt, t, v1, v2)
      end
    end
    if count > 1 then p.ok, p.o, p.u, p.na, p.nb, p.t = ok, o, u, n2, n3, t end
  end
  if cost == 0 then return out end
  if not all then
    if count == 1 then return out end
    -- A sliding log's answer as if nothing were consumed needs its reset (the general
    -- path's).
    if set.log then return nil end
    as_if_nothing_consumed(set, count, out, true)
    return out
  end
  if count > 1 then value = fast_value(set, count) end
  -- states.lua's ttl_of(min_ttl, most), written out: after an admission every reset_after
  -- is at least 1 ms.
  if most < min_ttl then most = min_ttl end
  most = format('%d', most)
  redis.call('PSETEX', key, most, value)
  if set.log then fast_logs(set.log, most) end
  return out
end
