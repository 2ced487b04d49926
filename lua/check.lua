-- turnstile: one atomic call for one client key: check a request against the key's
-- policies, or give quota back (refund), or forget its state (reset).
--
-- Composed after prelude.lua, the per-algorithm pieces (bucket.lua, gcra.lua,
-- fixed_window.lua, sliding_window.lua, sliding_log.lua) and fast.lua (the path of the
-- common case: a check under the defaults of a key without configuration). It defines check(KEYS, ARGV),
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
-- ARGV[3] "<op> <unconfigured> <least TTL>": op 'check', 'refund' or 'reset'; for a key
--         without configuration 'defaults', 'deny' or 'allow'; the least TTL in ms of a
--         written key (0; 600000 with explicit simulation time)
-- ARGV[4] the key base "<prefix>:{<tag>}"
-- ARGV[5] and on: one argument per policy set, the defaults first, then the tiers: its tier
--         name ('' for the defaults), then per policy a line "\n<alg.L.P.B> <name>": its
--         parameters (algorithm id: 1 token bucket, 2 gcra, 3 leaky bucket, 4 fixed window,
--         5 sliding log, 6 sliding window; limit L; period P in ms; capacity: burst B for
--         buckets, L for windows), the very text its stored state begins with, and its name
--         (names and tiers hold no line break). The caller encodes a set once; a Function
--         library parses each set (and ARGV[3]) once per node (see SETS), so a call costs
--         five arguments and a table look-up whatever its policies.
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

-- Parsed arguments by their text: SETS[text] is set_of's answer for a policy set, FLAGS[text]
-- flags_of's for ARGV[3]. A Function library keeps them from call to call, so a policy set's
-- argument is parsed and checked once per node rather than on every call (a memo of a pure
-- parse: the same text always gives the same answer); with EVALSHA they live one call. At
-- most MEMO_MAX entries each; then a table starts over.
local SETS, SET_COUNT, FLAGS, FLAG_COUNT, MEMO_MAX = {}, 0, {}, 0, 1000

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

-- The policy of the parameters params ("alg.L.P.B", digits only, so s + 0 reads them in
-- decimal, as nat; bounded by policy_of) and name, or nil.
local function spec_of(params, name)
  local a, L, P, B = match(params, '^(%d+)%.(%d+)%.(%d+)%.(%d+)$')
  local s = a and policy_of(a + 0, L + 0, P + 0, B + 0)
  if not s or not valid_name(name) then return nil end
  s.name = name
  -- Canonical (no leading zero: the id, L, P and B are at least 1): the text is the stored
  -- states' prefix as it is.
  local text = params
  if find(params, '^0') or find(params, '.0', 1, true) then text = nil end
  s = keyed('', s, text)
  fast_spec(s)
  return s
end

-- A policy set's argument: {tier = its name ('' for the defaults), the policies in order},
-- or nil when it is malformed (a policy that is none, a name twice). The policies are the
-- calls' own tables: check gives each its keys for the call (see with_keys).
local function set_of(text)
  local set = SETS[text]
  if set then return set end
  local tier, from = match(text, '^([^\n]*)()')
  if tier ~= '' and not valid_tier(tier) then return nil end
  -- fast: no sliding log (fast.lua's fast_check may decide it); width: its reply's length
  -- under the defaults.
  set = {tier = tier, fast = true, width = 3}
  local seen = {}
  for params, name in string.gmatch(string.sub(text, from), '\n([^ \n]*) ([^\n]*)') do
    local p = spec_of(params, name)
    if not p or seen[name] then return nil end
    seen[name] = true
    set[#set + 1] = p
    if p.alg == 5 then set.fast = false end
    set.width = set.width + p.a.width
  end
  -- Every line read (a line without its space is skipped by gmatch, not matched).
  local _, lines = string.gsub(text, '\n', '\n')
  if lines ~= #set then return nil end
  if SET_COUNT >= MEMO_MAX then SETS, SET_COUNT = {}, 0 end
  SETS[text], SET_COUNT = set, SET_COUNT + 1
  return set
end

-- ARGV[3]: {op, unconfigured, least TTL}, or nil when it is malformed.
local OPS = {check = true, refund = true, reset = true}
local MODES = {defaults = true, deny = true, allow = true}
local function flags_of(text)
  local f = FLAGS[text]
  if f then return f end
  local op, mode, ttl = match(text, '^(%l+) (%l+) (%d+)$')
  if not op or not OPS[op] or not MODES[mode] or not nat(ttl) then return nil end
  -- fast: a check under the defaults when the key has no configuration (see check)
  f = {op, mode, ttl + 0, fast = op == 'check' and mode == 'defaults'}
  if FLAG_COUNT >= MEMO_MAX then FLAGS, FLAG_COUNT = {}, 0 end
  FLAGS[text], FLAG_COUNT = f, FLAG_COUNT + 1
  return f
end

-- The policies of set, each given this call's fields: its key (its log's key only for a
-- sliding log: logkey_of), and no carried-over mark; every other field a call uses (o, st,
-- now, ok, ttl, and what decide leaves for admitted) is written by the call before it is
-- read. (Names are unique in a set, and one call uses one set.)
local function with_keys(set, base)
  for i = 1, #set do
    local p = set[i]
    p.base, p.key, p.carried = base, base .. p.suffix, nil
    if p.alg == 5 then p.logkey = base .. p.logsuffix else p.logkey = nil end
  end
  return set
end

-- The key of p's log (a sliding log's, or one another algorithm's policy of the same name
-- left).
local function logkey_of(p)
  return p.logkey or (p.base .. p.logsuffix)
end

-- The set of tier in ARGV (tier nil: the defaults, ARGV[5]); false when no set has that
-- tier; nil and the argument's index for a malformed set.
local function find_set(ARGV, tier)
  if not tier then
    local set = ARGV[5] and set_of(ARGV[5])
    if not set or set.tier ~= '' then return nil, 5 end
    return set
  end
  for i = 6, #ARGV do
    local set = set_of(ARGV[i])
    if not set or set.tier == '' then return nil, i end
    if set.tier == tier then return set end
  end
  return false
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
  -- A cost of 1, the most common, without a pattern match.
  local cost = ARGV[2]
  if cost == '1' then cost = 1 else cost = int_arg(cost) end
  local flags, base = ARGV[3], ARGV[4]
  flags = FLAGS[flags or false] or (flags and flags_of(flags))
  if not now or not cost or not flags or not base then
    return redis.error_reply('TURNSTILE_ARGS malformed arguments')
  end
  local op, mode, min_ttl = flags[1], flags[2], flags[3]
  local cfgkey = KEYS[1]

  -- The common case first (fast.lua): a check under the defaults' set (parsed before: its
  -- memo) of a key without configuration (EXISTS answers a number, where HMGET's answer is
  -- a table); anything else, or fast_check's nil, takes the general path below.
  if flags.fast then
    local set = SETS[ARGV[5]]
    if set and set.fast and set.tier == '' and redis.call('EXISTS', cfgkey) == 0 then
      local out = fast_check(set, base, now, cost, min_ttl, 0)
      if out then return out end
    end
  end

  -- The key's configuration. One that cannot be read decides nothing, not even a reset
  -- (which policies apply is unknown): Quotas::clear_config (`turnstile quota rm`) removes
  -- it.
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
    local set, bad_at
    if cfg[2] then
      set, bad_at = find_set(ARGV, cfg[2])
      if set == nil then return redis.error_reply('TURNSTILE_ARGS malformed set ' .. bad_at) end
      if set then applied, tier = 2, cfg[2] end
    end
    if not set then
      if mode == 'deny' then
        applied = 3
      elseif mode == 'allow' then
        applied = 4
      else
        set, bad_at = find_set(ARGV, nil)
        if not set then return redis.error_reply('TURNSTILE_ARGS malformed set ' .. bad_at) end
      end
    end
    if set and applied == 0 and op == 'check' and set.fast then
      -- The common case (fast.lua); nil: the general path below.
      local out = fast_check(set, base, now, cost, min_ttl, version)
      if out then return out end
    end
    if set then policies = with_keys(set, base) end
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
