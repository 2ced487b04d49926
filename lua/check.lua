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
-- Returns {now, version, applied (0 defaults, 1 override, 2 tier, 3 denied, 4 unlimited),
-- [the tier's name: only when applied is 2], then per policy: [alg, L, P, B, name: only for
-- an override, whose policies the caller does not know; the defaults' and a tier's are the
-- caller's own, in the order it sent them] its result, as many values as its algorithm
-- writes (a.width), every duration exact:
--   token bucket, GCRA:   retry, remaining, reset           durations: numerators over L ms
--   leaky bucket:         retry, remaining, reset, delay    durations: numerators over L ms
--   fixed window, log:    retry, remaining, reset           durations: whole ms
--   sliding window:       retry whole, num, den, remaining, reset (whole ms)
-- retry -1 (with num 0, den 1) is never; the policy admits exactly when retry is 0 (a
-- denial's retry is always above 0). refund and reset answer as a query (cost 0) made
-- after them.

-- Every piece below is a top-level function taking what it needs as arguments: a call creates
-- no closure.

-- Parsed policies by their argument text: SPECS[params][name] is what policies_at makes of
-- them. A Function library keeps it from call to call, so a policy set's arguments are
-- parsed and checked once per node rather than on every call (a memo of a pure parse: the
-- same text always gives the same policy); with EVALSHA it lives one call. At most SPEC_MAX
-- policies are kept; then it starts over.
local SPECS, SPEC_COUNT, SPEC_MAX = {}, 0, 1000

-- A policy with its keys: an override's (see parse_override) or a spec's. params is the text
-- its state begins with: the arguments as they came when they are canonical (no leading zero:
-- the id, L, P and B are at least 1), else rewritten.
local function keyed(base, p, params)
  p.base = base
  p.a = algorithm(p.alg)
  p.params = params or (int(p.alg) .. '.' .. int(p.L) .. '.' .. int(p.P) .. '.' .. int(p.B))
  p.suffix = ':' .. STATE_FORMAT .. ':' .. p.name
  p.logsuffix = '~log:' .. STATE_FORMAT .. ':' .. p.name
  p.key = base .. p.suffix
  p.logkey = base .. p.logsuffix
  return p
end

-- The policy of the arguments params ("alg.L.P.B", digits only, so s + 0 reads them in
-- decimal, as nat; bounded by policy_of) and name, or nil.
local function spec_of(params, name)
  local named = SPECS[params]
  local s = named and named[name]
  if s then return s end
  local a, L, P, B = match(params, '^(%d+)%.(%d+)%.(%d+)%.(%d+)$')
  s = a and policy_of(a + 0, L + 0, P + 0, B + 0)
  if not s or not valid_name(name) then return nil end
  s.name = name
  -- Canonical (no leading zero: the id, L, P and B are at least 1): the text is the stored
  -- states' prefix as it is.
  local text = params
  if find(params, '^0') or find(params, '.0', 1, true) then text = nil end
  keyed('', s, text)
  if SPEC_COUNT >= SPEC_MAX then SPECS, SPEC_COUNT = {}, 0 end
  named = SPECS[params]
  if not named then named = {}; SPECS[params] = named end
  named[name], SPEC_COUNT = s, SPEC_COUNT + 1
  return s
end

-- The n policies of the set whose first policy is at ARGV[at] (2 arguments each: "alg.L.P.B"
-- and the name), or nil and the index of the first malformed one. Each is its spec itself,
-- given this call's fields: its key (its log's key only for a sliding log: logkey_of), and
-- no carried-over mark; every other field a call uses (o, st, now, ok, ttl, and what decide
-- leaves for admitted) is written by the call before it is read. (Names are unique in a set,
-- and one call uses one set: no spec appears twice in a call.)
local function policies_at(ARGV, base, at, n)
  local set = {}
  for i = 1, n do
    local p = spec_of(ARGV[at], ARGV[at + 1])
    if not p then return nil, i end
    p.base, p.key, p.carried = base, base .. p.suffix, nil
    if p.alg == 5 then p.logkey = base .. p.logsuffix else p.logkey = nil end
    set[i] = p
    at = at + 2
  end
  return set
end

-- The key of p's log (a sliding log's, or one another algorithm's policy of the same name
-- left).
local function logkey_of(p)
  return p.logkey or (p.base .. p.logsuffix)
end

-- An argument's integer, read as nat reads one (ARGV holds strings only: a missing one is
-- nil), without nat's type check.
local function int_arg(s)
  if s and find(s, '^%d+$') then
    local n = s + 0
    if n <= MAX_EXACT then return n end
  end
  return nil
end

-- Where the policies of the set of tier begin in ARGV (tier nil: the defaults, the first
-- set) and their count; false when no set has that tier; nil and the set's index for a
-- malformed set. Only the set that applies is parsed: the others are skipped by their
-- counts alone.
local function find_set(ARGV, sets, tier)
  local at = 8
  for s = 1, sets do
    local name, n = ARGV[at], int_arg(ARGV[at + 1])
    if not name or not n then return nil, s end
    if (s == 1 and not tier) or (s > 1 and name == tier) then return at + 2, n end
    at = at + 2 + 2 * n
  end
  return false
end

-- A refund or a reset bumps the key's version (out[2]), once every state it needs was read
-- (an error reply changes nothing).
local function bump(cfgkey, cfg, out)
  out[2] = redis.call('HINCRBY', cfgkey, 'v', 1)
  if not cfg[1] and not cfg[2] then
    -- A version alone is kept a day: long enough for anyone holding the old one to see it.
    redis.call('PEXPIRE', cfgkey, 86400000)
  end
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
  if p.alg == 5 then redis.call('PEXPIRE', p.logkey, format('%d', ttl)) end
end

-- The TTL of a key whose reset_after rounds up to reset ms: at least min_ttl and 1 ms.
local function ttl_of(min_ttl, reset)
  if reset < min_ttl then reset = min_ttl end
  if reset < 1 then return 1 end
  return reset
end

-- refund: read every state (a sliding log's entries too) before anything changes, bump the
-- version, then as turnstile-core's refund: a carried-over state is stored (the old
-- parameters' state is gone), then cost units go back, if there are any to give (refund
-- returns nil when there is nothing: another window, an empty log). A state with nothing
-- left in use is dropped. Returns an error, or nil.
local function refund_all(cfgkey, cfg, out, min_ttl, policies, cost)
  local scratch = {}
  for i = 1, #policies do
    local p = policies[i]
    local ok, err = p.a.decide(p, p.st, p.now, 0, scratch, 0)
    if ok == nil then return err end
  end
  bump(cfgkey, cfg, out)
  for i = 1, #policies do
    local p = policies[i]
    local a = p.a
    local st = nil
    if cost > 0 then st = a.refund(p, p.st, p.now, cost) end
    if not st and p.carried then st = p.st end
    if st then
      local ok, reset = a.decide(p, st, p.now, 0, scratch, 0)
      if ok == nil then return reset end
      if reset > 0 then
        save(p, st, ttl_of(min_ttl, reset))
        p.st = st
      else
        -- nothing left in use: the key is fresh
        redis.call('DEL', p.key, logkey_of(p))
        p.st = a.fresh()
      end
    end
  end
  return nil
end

local function check(KEYS, ARGV)
  if not match then bind() end
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
    now = int_arg(t_arg)
  end
  local cost, min_ttl, sets = int_arg(ARGV[2]), int_arg(ARGV[3]), int_arg(ARGV[7])
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

  -- Which policies apply: the override, else the tier, else the unconfigured behaviour.
  local policies, applied, tier = nil, 0, nil
  if cfg[1] then
    policies, applied = parse_override(cfg[1]), 1
    for _, p in ipairs(policies) do keyed(base, p) end
  else
    local at, n
    if cfg[2] then
      at, n = find_set(ARGV, sets, cfg[2])
      if at == nil then return redis.error_reply('TURNSTILE_ARGS malformed set ' .. n) end
      if at then applied, tier = 2, cfg[2] end
    end
    if not at then
      if mode == 'deny' then
        applied = 3
      elseif mode == 'allow' then
        applied = 4
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

  local out, o = {now, version, applied}, 3
  if tier then out[4], o = tier, 4 end
  if not policies then
    if op ~= 'check' then bump(cfgkey, cfg, out) end
    return out
  end
  -- Where each policy's values go in the reply.
  local count = #policies
  for i = 1, count do
    local p = policies[i]
    if applied == 1 then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = p.alg, p.L, p.P, p.B, p.name
      o = o + 5
    end
    p.o = o
    o = o + p.a.width
  end

  if op == 'reset' then
    -- Forget whatever the keys hold, garbage included: nothing is read.
    for i = 1, count do
      local p = policies[i]
      redis.call('DEL', p.key, logkey_of(p))
      p.st, p.now = p.a.fresh(), now
    end
    bump(cfgkey, cfg, out)
  else
    for i = 1, count do
      local p = policies[i]
      local st = load(p, now)
      if st.err then return redis.error_reply(st.err) end
      -- A clock earlier than the key's last update: use the last update's time.
      p.st, p.now = st, now
      if st.updated > now then p.now = st.updated end
    end
  end

  if op == 'refund' then
    local err = refund_all(cfgkey, cfg, out, min_ttl, policies, cost)
    if err then return redis.error_reply(err.err) end
  end

  local c = cost
  if op ~= 'check' then c = 0 end
  local all = true
  for i = 1, count do
    local p = policies[i]
    local ok, ttl = p.a.decide(p, p.st, p.now, c, out, p.o)
    if ok == nil then return redis.error_reply(ttl.err) end
    if not ok then all = false end
    p.ok, p.ttl = ok, ttl
  end

  if c > 0 then
    for i = 1, count do
      local p = policies[i]
      if all then
        save(p, p.a.admitted(p, p.st, p.now, c), ttl_of(min_ttl, p.ttl))
      elseif p.ok then
        -- Denied overall: report this policy as if nothing were consumed.
        local ok, err = p.a.decide(p, p.st, p.now, 0, out, p.o)
        if ok == nil then return redis.error_reply(err.err) end
        if p.alg == 3 then out[p.o + 4] = 0 end
      end
    end
  end

  return out
end
