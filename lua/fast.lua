-- turnstile: the fast path of check (check.lua) for the common case: a check (not a refund or
-- a reset) under the defaults' policy set of a key whose state string (KEYS[1], see
-- states.lua) was written with no configuration (header '0') and holds exactly the set's
-- policies, in the set's order, each under its own parameters — or of a key with no state
-- string and no configuration hash (one EXISTS: a fresh key). It decides from locals: one
-- GET, one anchored match of the whole string against the set's pattern (the header, then
-- per policy its parameter text, exactly its algorithm's count of numbers — digits only, so
-- s + 0 reads them in decimal, as nat — and its name), the algorithms' arithmetic written
-- straight into the reply, and, when every policy admits a cost above 0, one PSETEX of the
-- whole string with the largest of the policies' TTLs. It creates no table but the reply
-- (and, for several policies, the match's captures). A sliding log is decided here only
-- when it admits with nothing to prune (fast_log): its list's oldest entry read (and its
-- newest when the state was updated at now), then one entry written and the list given the
-- string's TTL.
--
-- Anything else — a header 'c' (the key has or had a configuration), a state under other
-- parameters (carried over), other policies, a string that is not a state, another type at
-- the key, a sliding log's query, denial or expired entry — makes fast_check return nil
-- before anything is written, and check takes its general path, which reads the state
-- again and decides (or reports the invalid state) exactly as before. Every decision here
-- is the general path's, step for step (bucket.lua's debt_now and debt_decide, gcra.lua,
-- fixed_window.lua, sliding_window.lua, sliding_log.lua's decide and admitted), on every
-- state the scripts leave. (On a sliding log whose newest entry is garbage and its oldest
-- not, the general path reports it at once; fast_log, which need not read the newest,
-- appends after it, and the general path reports it when it reads it: a query, a denial,
-- once the entries before it expire.)

-- A set's policy made ready for the fast path (from spec_of): the anchored pattern of its
-- stored state (its parameter text, then exactly its algorithm's count of numbers), its
-- reply's width, and the bounds its states are checked against.
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
  p.BP = p.B * p.P
  p.leaky = p.alg == 3
  p.fast = FAST[p.alg]
end

-- The fast path's decisions, one function per algorithm (p.fast, set by fast_spec): each
-- decides policy p at now for cost c on its stored numbers n1 .. n3 (the match's captures,
-- digit strings; n1 nil: no state), writes its values at out[o + 1 ..], and returns whether
-- it admits, the TTL its state needs (ttl_of(min_ttl, reset_after)), and its line formatted
-- with fmt (p.fmt or p.fmt0) when it admits c > 0 (else nil); or nil when the numbers are
-- not a state (the general path reports it).

-- Each returns its TTL as ttl_of(min_ttl, reset) does, written out (no call).

-- Token bucket, GCRA and leaky bucket: updated, debt <= B * P. Refilled: 0 once elapsed * L
-- >= debt (a product past 2^53 rounds to a double at least debt, rounding being monotonic:
-- the comparison is exact), else debt - elapsed * L, below 2^53 and exact. Then bucket.lua's
-- debt_decide on that debt D (at most B * P).
local function fast_bucket(p, n1, n2, n3, now, c, min_ttl, out, o, fmt)
  local B, P, L = p.B, p.P, p.L
  local t, D = now, 0
  if n1 then
    n1, n2 = n1 + 0, n2 + 0
    if n1 > MAX_EXACT or n2 > p.BP then return nil end
    if n1 > now then t = n1 end
    local refill = (t - n1) * L
    if refill < n2 then D = n2 - refill end
  end
  local retry, after, delay = -1, D, 0
  if c == 0 then
    retry, delay = 0, D
  elseif c <= B then
    local room = (B - c) * P
    if D <= room then
      after, retry, delay = D + c * P, 0, D
    else
      retry = D - room
    end
  end
  local r = after % P
  local used = (after - r) / P
  if r > 0 then used = used + 1 end
  out[o + 1], out[o + 2], out[o + 3] = retry, B - used, after
  if p.leaky then out[o + 4] = delay end
  r = after % L
  local ttl = (after - r) / L
  if r > 0 then ttl = ttl + 1 end
  if ttl < min_ttl then ttl = min_ttl end
  if ttl < 1 then ttl = 1 end
  if retry ~= 0 then return false, ttl end
  if c == 0 then return true, ttl end
  return true, ttl, format(fmt, t, after)
end

-- fixed_window.lua: updated, n; n <= L, counted in updated's window.
local function fast_fixed(p, n1, n2, n3, now, c, min_ttl, out, o, fmt)
  local L, P, t = p.L, p.P, now
  local n = 0
  if n1 then
    n1, n2 = n1 + 0, n2 + 0
    if n1 > MAX_EXACT or n2 > L then return nil end
    if n1 > now then t = n1 end
  end
  local e = t % P
  if n1 and n1 - n1 % P == t - e then n = n2 end
  local retry, k = -1, n
  if c == 0 then
    retry = 0
  elseif c <= L then
    if n <= L - c then
      retry, k = 0, n + c
    else
      retry = P - e
    end
  end
  local reset = 0
  if k > 0 then reset = P - e end
  out[o + 1], out[o + 2], out[o + 3] = retry, L - k, reset
  local ttl = reset
  if ttl < min_ttl then ttl = min_ttl end
  if ttl < 1 then ttl = 1 end
  if retry ~= 0 then return false, ttl end
  if c == 0 then return true, ttl end
  return true, ttl, format(fmt, t, k)
end

-- The sliding window's floor(L - est) (at least 0) with k counted in the current window,
-- weighted = m * (P - e): fast_sliding's and sliding_window.lua's decide's (composed later,
-- inside general_path).
local function sliding_remaining(L, P, weighted, k)
  if k > L then return 0 end
  local free = (L - k) * P - weighted
  if free <= 0 then return 0 end
  local r = free % P
  return (free - r) / P
end

-- sliding_window.lua: updated, cur, prev; both counts <= L, cur counted in updated's window.
local function fast_sliding(p, n1, n2, n3, now, c, min_ttl, out, o, fmt)
  local L, P, t = p.L, p.P, now
  local n, m = 0, 0
  if n1 then
    n1, n2, n3 = n1 + 0, n2 + 0, n3 + 0
    if n1 > MAX_EXACT or n2 > L or n3 > L then return nil end
    if n1 > now then t = n1 end
  end
  local e = t % P
  local w = (t - e) / P
  if n1 then
    local r = n1 % P
    local v = (n1 - r) / P
    if v == w then n, m = n2, n3 elseif v + 1 == w then m = n2 end
  end
  local weighted = m * (P - e)
  local rw, rn, rd, k = -1, 0, 1, n
  if c == 0 then
    rw = 0
  elseif c <= L then
    if n + c > L then
      local num = P * (n + c - L)
      rn, rd = num % n, n
      rw = (num - rn) / n + (P - e)
    elseif weighted <= (L - n - c) * P then
      rw, k = 0, n + c
    else
      local num = weighted - (L - n - c) * P
      rn, rd = num % m, m
      rw = (num - rn) / m
    end
  end
  local reset = 0
  if k > 0 then reset = 2 * P - e elseif m > 0 then reset = P - e end
  out[o + 1], out[o + 2], out[o + 3] = rw, rn, rd
  out[o + 4], out[o + 5] = sliding_remaining(L, P, weighted, k), reset
  local ttl = reset
  if ttl < min_ttl then ttl = min_ttl end
  if ttl < 1 then ttl = 1 end
  if rw ~= 0 or rn ~= 0 then return false, ttl end
  if c == 0 then return true, ttl end
  return true, ttl, format(fmt, t, k, m)
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

-- sliding_log.lua: updated, total, and the log at p.logkey (set by fast_check): decided here
-- only when it admits c > 0 with nothing to prune, the oldest entry live (else nil: a query, a
-- denial, an expired entry, an update after now, no log — the general path). It reads the
-- oldest entry (LINDEX 0), checked as log_entry checks it; the newest (LINDEX -1) only when
-- the state was updated at now: every entry is at most the update's time, so only then can
-- the newest be at now, which the entry then grows (LSET); else a new one follows it (RPUSH).
-- fast_check writes the log once the whole set admits (p.entry, p.grow).
local function fast_log(p, n1, n2, n3, now, c, min_ttl, out, o, fmt)
  local L, P = p.L, p.P
  if c == 0 or c > L then return nil end
  local used, grow = 0, nil
  if n1 then
    n1, n2 = n1 + 0, n2 + 0
    if n1 > now or n2 < 1 or n2 > L - c then return nil end
    local t = fast_entry(p.logkey, 0, n1, n2)
    if not t or now - t >= P then return nil end
    if n1 == now then
      -- Updated at now: the newest entry (no later than the update) may be at now.
      local tc
      t, tc = fast_entry(p.logkey, -1, n1, n2)
      if not t then return nil end
      if t == now then grow = tc + c end
    end
    used = n2
  end
  p.grow, p.nolog = grow, not n1
  p.entry = format('%d:%d', now, grow or c)
  out[o + 1], out[o + 2], out[o + 3] = 0, L - used - c, P
  local ttl = P
  if ttl < min_ttl then ttl = min_ttl end
  return true, ttl, format(fmt, now, used + c)
end

-- Writes the log of each sliding log of set as fast_log decided it (the whole set admitted)
-- and gives it the string's TTL ttl (text), as write_states does: a fresh state's leftover
-- log dropped first, then the entry at now grown or added.
local function fast_logs(set, ttl)
  for i = 1, set.count do
    local p = set[i]
    if p.alg == 5 then
      if p.nolog then redis.call('DEL', p.logkey) end
      if p.grow then
        redis.call('LSET', p.logkey, -1, p.entry)
      else
        redis.call('RPUSH', p.logkey, p.entry)
      end
      redis.call('PEXPIRE', p.logkey, ttl)
    end
  end
end

FAST = {fast_bucket, fast_bucket, fast_bucket, fast_fixed, fast_log, fast_sliding}

-- The reply of several policies: n values (7 or more for two policies), head first, the
-- rest 0, made at (about) its size at once: Redis reads a reply up to its first nil, so the
-- slots past n are cut off by one. (A single policy's is made in fast_check.)
local function new_reply(n, head)
  local out
  if n <= 8 then
    out = {head, 0, 0, 0, 0, 0, 0, 0}
  else
    out = {head, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  end
  out[n + 1] = nil
  return out
end

-- The reply of a check of set's policies (set.fast: at most 32 numbers) on
-- the state string at key (KEYS[1]) at now for cost, or nil for the general path (nothing
-- written then). cfgkey(key) is the configuration hash's key, read only for a fresh key.
-- The reply is the compact one (check.lua's header): -1 - now (the defaults applied,
-- version 0), then each policy's values.
local function fast_check(set, key, now, cost, min_ttl, cfgkey)
  local raw = redis.pcall('GET', key)
  if raw then
    -- An error reply (another type at the key) is a table; a string's .err is nil (its
    -- metatable's index is the string library), without a call of type().
    if raw.err then return nil end
  else
    -- A fresh key: no configuration hash (and a key of the right form: nil, else).
    local cfg = cfgkey(key)
    if not cfg or redis.call('EXISTS', cfg) ~= 0 then return nil end
  end
  if set.log then
    -- Each sliding log's list (the key's base, then the policy's suffix).
    local base = string.sub(key, 1, -#FORMAT_SUFFIX - 1)
    for i = 1, set.count do
      local p = set[i]
      if p.alg == 5 then p.logkey = base .. p.logsuffix end
    end
  end
  local count = set.count
  if count == 1 then
    local p, out = set[1], nil
    local width = p.a.width
    if width == 3 then
      out = {-1 - now, 0, 0, 0}
    elseif width == 4 then
      out = {-1 - now, 0, 0, 0, 0}
    else
      out = {-1 - now, 0, 0, 0, 0, 0}
    end
    local n1, n2, n3
    if raw then
      n1, n2, n3 = match(raw, set.pat)
      if not n1 then return nil end
    end
    local ok, ttl, value = p.fast(p, n1, n2, n3, now, cost, min_ttl, out, 1, p.fmt0)
    if ok == nil then return nil end
    if value then
      ttl = format('%d', ttl)
      redis.call('PSETEX', key, ttl, value)
      if set.log then fast_logs(set, ttl) end
    end
    return out
  end
  -- Every policy decided first (its TTL, line and captures' offset kept on its cached
  -- table: fields, no new table); then the string stored only if all admit.
  local out = new_reply(set.width - 2, -1 - now)
  local caps
  if raw then
    caps = {match(raw, set.pat)}
    if not caps[1] then return nil end
  else
    caps = set.none
  end
  local all, o, k, most = true, 1, 1, 0
  for i = 1, count do
    local p = set[i]
    local ok, ttl, value = p.fast(p, caps[k], caps[k + 1], caps[k + 2], now, cost, min_ttl, out,
      o, p.fmt)
    if ok == nil then return nil end
    if not ok then all = false end
    if ttl > most then most = ttl end
    p.ok, p.value, p.fo, p.fk = ok, value, o, k
    o, k = o + p.a.width, k + p.a.fields
  end
  if cost > 0 then
    if all then
      -- Two or three policies: one string made at once (one CONCAT of every piece), not one
      -- per policy.
      local value
      if count == 2 then
        value = '0' .. set[1].value .. set[2].value
      elseif count == 3 then
        value = '0' .. set[1].value .. set[2].value .. set[3].value
      else
        value = '0'
        for i = 1, count do value = value .. set[i].value end
      end
      most = format('%d', most)
      redis.call('PSETEX', key, most, value)
      if set.log then fast_logs(set, most) end
    else
      -- A sliding log's answer as if nothing were consumed needs its reset (the general
      -- path's).
      if set.log then return nil end
      for i = 1, count do
        local p = set[i]
        if p.ok then
          -- Denied overall: this policy as if nothing were consumed.
          local k = p.fk
          p.fast(p, caps[k], caps[k + 1], caps[k + 2], now, 0, min_ttl, out, p.fo, p.fmt)
          if p.leaky then out[p.fo + 4] = 0 end
        end
      end
    end
  end
  return out
end
