-- turnstile: one atomic call for one client key: check a request against the key's
-- policies, or give quota back (refund), or forget its state (reset).
--
-- Composed after prelude.lua and the per-algorithm pieces (bucket.lua, gcra.lua,
-- fixed_window.lua, sliding_window.lua, sliding_log.lua). It defines check(KEYS, ARGV),
-- which the Rust side composes into both the Redis Function library (registered there
-- and called with FCALL: every definition above runs once, at FUNCTION LOAD) and the
-- EVALSHA script (the definitions, then `return check(KEYS, ARGV)`). Everything is local:
-- a Function library may create or read no global at run time.
--
-- KEYS[1] the key's configuration, a hash: o = its override (lines "alg L P B name"),
--         t = its tier, v = its version. Every other key this call touches is
--         ARGV[6] .. ':f2:' .. policy name (state) or ARGV[6] .. '~log:f2:' .. name (a
--         sliding log), all in KEYS[1]'s Cluster slot: ARGV[6] is KEYS[1]'s prefix and hash
--         tag, and 'f2' the stored format's version (STATE_FORMAT in prelude.lua).
--         (An override's policies are only known once KEYS[1] is read, so their keys
--         cannot be passed in KEYS.)
-- ARGV[1] the time in ms since the epoch, or '' to use the server's TIME (production)
-- ARGV[2] the cost (check, refund), 0 <= cost <= 2^53 - 1; 0 is a query
-- ARGV[3] the least TTL in ms of a written key (0; 600000 with explicit simulation time)
-- ARGV[4] for a key without configuration: 'defaults', 'deny' or 'allow'
-- ARGV[5] 'check', 'refund' or 'reset'
-- ARGV[6] the key base "<prefix>:{<tag>}"
-- ARGV[7] the number of policy sets S: the defaults, then the tiers
-- then per set: its tier name ('' for the defaults), its policy count N, then per policy
--         two arguments: its parameters "alg.L.P.B" (algorithm id: 1 token bucket, 2 gcra,
--         3 leaky bucket, 4 fixed window, 5 sliding log, 6 sliding window; limit L; period
--         P in ms; capacity: burst B for buckets, L for windows), the very text its stored
--         state begins with, encoded once per policy set by the caller; and its name
--
-- Stored states begin with their parameters "alg.L.P.B"; a state written under other
-- parameters carries over by the rule of SEMANTICS-level carry_over (see turnstile-core's
-- algorithm::carry_over), evaluated at this call and stored only with an admitted request.
--
-- check is all-or-nothing: every policy is evaluated first; only if all admit (and cost >
-- 0) is any state written. When the request is denied, the policies that would have
-- admitted report their fields as if nothing were consumed.
--
-- Errors (error replies change nothing): TURNSTILE_ARGS for malformed arguments;
-- TURNSTILE_INVALID_STATE when the configuration cannot be read (every operation: which
-- policies apply is unknown; config.lua's 'clear' removes it) or, for check and refund, a
-- policy's state cannot (see load). reset reads no state: it deletes whatever the applying
-- policies' keys hold, so it repairs a key holding garbage.
--
-- Returns {now, applied (0 defaults, 1 override, 2 tier, 3 denied, 4 unlimited), tier name
-- or '', version, N, then per policy: [alg, L, P, B, name: only for an override, whose
-- policies the caller does not know; the defaults' and a tier's are the caller's own, in
-- the order it sent them] allowed, remaining, retry whole ms (-1: never), retry num, retry
-- den, reset whole, num, den, delay whole, num, den}: each duration is whole + num / den
-- ms, exactly. refund and reset answer as a query (cost 0)
-- made after them.

-- Every piece below is a top-level function taking what it needs as arguments: a call creates
-- no closure. cx is the call's context: now, min_ttl, base (ARGV[6]), cfgkey (KEYS[1]), cfg
-- (HMGET's reply), version, applied, tier.

-- A policy with its keys: ARGV's parts (text) or an override's (see parse_override).
-- params is the text its state begins with: the arguments as they came when they are
-- canonical (no leading zero: the id, L, P and B are at least 1), else rewritten.
local function keyed(base, p, params)
  p.a = algorithm(p.alg)
  p.params = params or (int(p.alg) .. '.' .. int(p.L) .. '.' .. int(p.P) .. '.' .. int(p.B))
  p.key = base .. ':' .. STATE_FORMAT .. ':' .. p.name
  p.logkey = base .. '~log:' .. STATE_FORMAT .. ':' .. p.name
  return p
end

-- The n policies of the set whose first policy is at ARGV[at] (2 arguments each: "alg.L.P.B"
-- and the name), or nil and the index of the first malformed one. The parameters are
-- digits only (so s + 0 reads them in decimal, as nat) and bounded by policy_of.
local function policies_at(ARGV, base, at, n)
  local set = {}
  for i = 1, n do
    local params, name = ARGV[at], ARGV[at + 1]
    local a, L, P, B = match(params, '^(%d+)%.(%d+)%.(%d+)%.(%d+)$')
    local p = a and policy_of(a + 0, L + 0, P + 0, B + 0)
    if not p or not valid_name(name) then return nil, i end
    p.name = name
    -- Canonical (no leading zero: the id, L, P and B are at least 1): the text is the
    -- stored states' prefix as it is.
    if find(params, '^0') or find(params, '.0', 1, true) then params = nil end
    set[i] = keyed(base, p, params)
    at = at + 2
  end
  return set
end

-- Where the policies of the set of tier begin in ARGV (tier nil: the defaults, the first
-- set) and their count; false when no set has that tier; nil and the set's index for a
-- malformed set. Only the set that applies is parsed: the others are skipped by their
-- counts alone.
local function find_set(ARGV, sets, tier)
  local at = 8
  for s = 1, sets do
    local name, n = ARGV[at], nat(ARGV[at + 1])
    if not name or not n then return nil, s end
    if (s == 1 and not tier) or (s > 1 and name == tier) then return at + 2, n end
    at = at + 2 + 2 * n
  end
  return false
end

-- A refund or a reset bumps the key's version, once every state it needs was read (an
-- error reply changes nothing).
local function bump(cx)
  cx.version = redis.call('HINCRBY', cx.cfgkey, 'v', 1)
  if not cx.cfg[1] and not cx.cfg[2] then
    -- A version alone is kept a day: long enough for anyone holding the old one to see it.
    redis.call('PEXPIRE', cx.cfgkey, 86400000)
  end
end

local function reply(cx, policies, results)
  local n = #results
  local out, o = {cx.now, cx.applied, cx.tier, cx.version, n}, 5
  local full = cx.applied == 1
  for i = 1, n do
    local r = results[i]
    local retry, reset, delay = r.retry, r.reset, r.delay
    if full then
      local p = policies[i]
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = p.alg, p.L, p.P, p.B, p.name
      o = o + 5
    end
    out[o + 1], out[o + 2] = r.allowed, r.remaining
    if retry then
      out[o + 3], out[o + 4], out[o + 5] = retry[1], retry[2], retry[3]
    else
      out[o + 3], out[o + 4], out[o + 5] = -1, 0, 1
    end
    out[o + 6], out[o + 7], out[o + 8] = reset[1], reset[2], reset[3]
    out[o + 9], out[o + 10], out[o + 11] = delay[1], delay[2], delay[3]
    o = o + 11
  end
  return out
end

-- A fresh state of p's algorithm, last updated at t.
local function fresh_at(p, t)
  local f = p.a.fresh()
  f.updated = t
  return f
end

-- The state of p, in p's terms: a state stored under other parameters carries over.
local function carry(q, p, st, t)
  if is_bucket(q.alg) and is_bucket(p.alg) then
    local units = min(ceildiv(debt_now(q, st, t), q.P), p.B)
    if units == 0 then return fresh_at(p, t) end
    return debt_state(p, units * p.P, t)
  elseif q.alg == 4 and p.alg == 4 then
    local count = 0
    if st.w == divmod(t, q.P) then count = st.n end
    local w = divmod(t, p.P)
    if count == 0 or divmod(st.updated, p.P) ~= w then return fresh_at(p, t) end
    return {updated = t, w = w, n = min(count, p.L)}
  elseif q.alg == 6 and p.alg == 6 then
    local n, m = sliding_counts(st, divmod(t, q.P))
    local w = divmod(t, p.P)
    if q.P == p.P then
      if n == 0 and m == 0 then return fresh_at(p, t) end
      return {updated = t, w = w, cur = min(n, p.L), prev = min(m, p.L)}
    end
    local total, written = min(n + m, p.L), divmod(st.updated, p.P)
    if total == 0 then return fresh_at(p, t) end
    if written == w then return {updated = t, w = w, cur = total, prev = 0} end
    if written + 1 == w then return {updated = t, w = w, cur = 0, prev = total} end
    return fresh_at(p, t)
  elseif q.alg == 5 and p.alg == 5 then
    -- The log as it is, unless every entry expired under q (the key's reset_after elapsed:
    -- it is fresh, though not dropped yet); a longer period must not revive it.
    local newest, _, err = log_newest(p, st)
    if err then return err end
    if not newest and st.total > 0 then return bad(p.logkey, 'no log') end
    if not newest or t - newest >= q.P then return fresh_at(p, t) end
    return st
  end
  return fresh_at(p, t)
end

-- The stored state of p at p.key, in p's terms, or an error ({err = ...}) when the key holds
-- anything the scripts do not write: another type, other fields, a number that is not one
-- (see nat), a state no sequence of requests leaves. Sets p.carried when the state was
-- written under other parameters (and carried over).
local function load(p, now)
  local key = p.key
  local raw = redis.pcall('GET', key)
  local a = p.a
  if not raw then return a.fresh() end
  if type(raw) ~= 'string' then return bad(key, raw.err) end
  -- The common case: written under p's own parameters (as p.params spells them), then
  -- exactly a.fields numbers, each digits only (so s + 0 reads it in decimal, as nat), read
  -- with one anchored match.
  local pre, n1, n2, n3, n4 = match(raw, STATE_FIELDS[a.fields])
  if pre == p.params then
    n1, n2 = n1 + 0, n2 + 0
    if n3 then n3 = n3 + 0 end
    if n4 then n4 = n4 + 0 end
    if n1 <= MAX_EXACT and n2 <= MAX_EXACT and (not n3 or n3 <= MAX_EXACT)
       and (not n4 or n4 <= MAX_EXACT) then
      return a.parse(p, n1, n2, n3, n4) or bad(key)
    end
    return bad(key)
  end
  -- Anything else: parameters written otherwise (carried over), or not a state at all.
  local parts = fields(raw, '|')
  local q = parse_params(parts[1])
  if not q or #parts ~= algorithm(q.alg).fields + 1 then return bad(key) end
  local nums = {}
  for i = 2, #parts do
    nums[i - 1] = nat(parts[i])
    if not nums[i - 1] then return bad(key) end
  end
  local st = algorithm(q.alg).parse(q, nums[1], nums[2], nums[3], nums[4])
  if not st then return bad(key) end
  if q.alg == p.alg and q.L == p.L and q.P == p.P and q.B == p.B then return st end
  local t = now
  if st.updated > t then t = st.updated end
  p.carried = true
  return carry(q, p, st, t)
end

local function save(p, st, ttl)
  store(p.key, p.a.encode(p.params, st), ttl)
  if p.alg == 5 then redis.call('PEXPIRE', p.logkey, ttl) end
end

-- The TTL of a key whose reset_after is reset: rounded up, at least min_ttl and 1 ms.
local function ttl_of(min_ttl, reset)
  local ttl = reset[1]
  if reset[2] > 0 then ttl = ttl + 1 end
  if ttl < min_ttl then ttl = min_ttl end
  if ttl < 1 then ttl = 1 end
  return ttl
end

-- refund: read every state (a sliding log's entries too) before anything changes, bump the
-- version, then as turnstile-core's refund: a carried-over state is stored (the old
-- parameters' state is gone), then cost units go back, if there are any to give (refund
-- returns nil when there is nothing: another window, an empty log). A state with nothing
-- left in use is dropped. Returns an error reply, or nil.
local function refund_all(cx, policies, states, cost)
  for i, p in ipairs(policies) do
    local r = p.a.decide(p, states[i], p.now, 0)
    if r.err then return r.err end
  end
  bump(cx)
  for i, p in ipairs(policies) do
    local a = p.a
    local st = nil
    if cost > 0 then st = a.refund(p, states[i], p.now, cost) end
    if not st and p.carried then st = states[i] end
    if st then
      local r = a.decide(p, st, p.now, 0)
      if r.err then return r.err end
      if dur_ceil(r.reset) > 0 then
        save(p, st, ttl_of(cx.min_ttl, r.reset))
        states[i] = st
      else
        -- nothing left in use: the key is fresh
        redis.call('DEL', p.key, p.logkey)
        states[i] = a.fresh()
      end
    end
  end
  return nil
end

local function check(KEYS, ARGV)
  local now
  local t_arg = ARGV[1]
  if t_arg == '' then
    -- The server's own reply, two decimal integers (seconds, microseconds): read by
    -- arithmetic directly, as nat would read them.
    local t = redis.call('TIME')
    local us = t[2] + 0
    local r = us % 1000
    now = t[1] * 1000 + (us - r) / 1000
  else
    now = nat(t_arg)
  end
  local cost, min_ttl, sets = nat(ARGV[2]), nat(ARGV[3]), nat(ARGV[7])
  local mode, op, base = ARGV[4], ARGV[5], ARGV[6]
  if not now or not cost or not min_ttl or not sets
     or (op ~= 'check' and op ~= 'refund' and op ~= 'reset') then
    return redis.error_reply('TURNSTILE_ARGS malformed arguments')
  end

  -- The key's configuration. One that cannot be read decides nothing, not even a reset
  -- (which policies apply is unknown): Quotas::clear_config (`turnstile quota rm`) removes
  -- it.
  local cfgkey = KEYS[1]
  local cfg = redis.pcall('HMGET', cfgkey, 'o', 't', 'v')
  local problem
  if cfg.err then
    problem = 'not a hash (' .. cfg.err .. ')'
  elseif cfg[1] or cfg[2] or cfg[3] then
    problem = config_problem(cfg)
  end
  if problem then
    return redis.error_reply('TURNSTILE_INVALID_STATE invalid configuration at ' .. cfgkey
      .. ': ' .. problem .. '; clearing the configuration (turnstile quota rm) removes it')
  end
  local version = 0
  if cfg[3] then version = cfg[3] + 0 end
  local cx = {now = now, min_ttl = min_ttl, base = base, cfgkey = cfgkey, cfg = cfg,
              version = version, applied = 0, tier = ''}

  -- Which policies apply: the override, else the tier, else the unconfigured behaviour.
  local policies
  if cfg[1] then
    policies, cx.applied = parse_override(cfg[1]), 1
    for _, p in ipairs(policies) do keyed(base, p) end
  else
    local at, n
    if cfg[2] then
      at, n = find_set(ARGV, sets, cfg[2])
      if at == nil then return redis.error_reply('TURNSTILE_ARGS malformed set ' .. n) end
      if at then cx.applied, cx.tier = 2, cfg[2] end
    end
    if not at then
      if mode == 'deny' then
        cx.applied = 3
      elseif mode == 'allow' then
        cx.applied = 4
      else
        at, n = find_set(ARGV, sets, nil)
        if not at then return redis.error_reply('TURNSTILE_ARGS malformed set 1') end
      end
    end
    if at then
      local bad_at
      policies, bad_at = policies_at(ARGV, base, at, n)
      if not policies then
        return redis.error_reply('TURNSTILE_ARGS malformed policy ' .. bad_at)
      end
    end
  end

  if not policies then
    if op ~= 'check' then bump(cx) end
    return reply(cx, nil, {})
  end

  local states = {}
  if op == 'reset' then
    -- Forget whatever the keys hold, garbage included: nothing is read.
    for i, p in ipairs(policies) do
      redis.call('DEL', p.key, p.logkey)
      states[i] = p.a.fresh()
      p.now = now
    end
    bump(cx)
  else
    for i, p in ipairs(policies) do
      local st = load(p, now)
      if st.err then return redis.error_reply(st.err) end
      -- A clock earlier than the key's last update: use the last update's time.
      p.now = now
      if st.updated > now then p.now = st.updated end
      states[i] = st
    end
  end

  if op == 'refund' then
    local err = refund_all(cx, policies, states, cost)
    if err then return redis.error_reply(err) end
  end

  local c = cost
  if op ~= 'check' then c = 0 end
  local results, all = {}, true
  for i, p in ipairs(policies) do
    local r = p.a.decide(p, states[i], p.now, c)
    if r.err then return redis.error_reply(r.err) end
    results[i] = r
    if r.allowed == 0 then all = false end
  end

  if c > 0 then
    for i, p in ipairs(policies) do
      if all then
        local st = p.a.admitted(p, states[i], p.now, results[i], c)
        save(p, st, ttl_of(min_ttl, results[i].reset))
      elseif results[i].allowed == 1 then
        -- Denied overall: report this policy as if nothing were consumed.
        local r = p.a.decide(p, states[i], p.now, 0)
        if r.err then return redis.error_reply(r.err) end
        r.delay = ZERO
        results[i] = r
      end
    end
  end

  return reply(cx, policies, results)
end
