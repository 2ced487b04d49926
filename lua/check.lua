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
-- KEYS[1] the client's state string, <prefix>:{<tag>}:f3 ('f3' the stored format's version,
--         STATE_FORMAT in prelude.lua): every policy's state of the client key in one
--         string, after a header saying whether the key had a configuration when it was
--         written (see states.lua). Every other key this call touches is derived from it,
--         all in its Cluster slot (the same hash tag): the configuration hash <prefix>:{<tag>}
--         ~cfg (o = its override, lines "alg L P B name"; t = its tier; v = its version), read
--         only when the state string does not say there is none (a fresh key: one EXISTS),
--         and a sliding log's list <prefix>:{<tag>}~log:f3:<policy name>.
-- ARGV[1] "<op> <unconfigured> <least TTL> <cost>[ <time>]": op 'check', 'refund' or
--         'reset'; for a key without configuration 'defaults', 'deny' or 'allow'; the least
--         TTL in ms of a written key (0; 600000 with explicit simulation time); the cost
--         (check, refund), 0 <= cost <= 2^53 - 1, 0 a query; and the time in ms since the
--         epoch, absent to use the server's TIME (production). One argument: the common
--         case's text is the same on every call, so a Function library parses it once.
-- ARGV[2] and on: one argument per policy set, the defaults first, then the tiers: its tier
--         name ('' for the defaults), then per policy a line "\n<alg.L.P.B> <name>": its
--         parameters (algorithm id: 1 token bucket, 2 gcra, 3 leaky bucket, 4 fixed window,
--         5 sliding log, 6 sliding window; limit L; period P in ms; capacity: burst B for
--         buckets, L for windows), the very text its stored state begins with, and its name
--         (names and tiers hold no line break). The caller encodes a set once; a Function
--         library parses each set (and ARGV[1]) once per node (see SETS), so a call costs
--         one key, two arguments and a table look-up whatever its policies.
--
-- Design (issue 15): the common case makes three Redis calls whatever the number of
-- policies — TIME, GET and PSETEX of the one string (fast.lua) — where one key per policy
-- and the configuration's probe made 2 + 2 per policy; a sliding log adds its list's own
-- three (its oldest entry, the new one, its TTL). Whatever creates or changes the
-- configuration hash (config.lua, a refund's or reset's version bump) marks the string in
-- the same atomic call, so the fast path never decides under a configuration it did not
-- read.
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
-- policy's state (any line of the state string) cannot (see read_states and decode). reset
-- forgets the applying policies' states whatever they hold (a string that cannot be read:
-- all of it), so it repairs a key holding garbage.
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
-- The compact reply of the common case (fast.lua: the defaults applied, version 0) drops
-- version and applied and gives -1 - now in now's place: {-1 - now, then per policy its
-- result}. A first value below 0 marks it (now is never below 0).

-- Every piece below is a top-level function taking what it needs as arguments: a call creates
-- no closure.

-- Parsed arguments by their text: SETS[text] is set_of's answer for a policy set, FLAGS[text]
-- flags_of's for ARGV[1]. A Function library keeps them from call to call, so a policy set's
-- argument is parsed and checked once per node rather than on every call (a memo of a pure
-- parse: the same text always gives the same answer); with EVALSHA they live one call. At
-- most MEMO_MAX entries (FLAGS_MAX for FLAGS, whose texts carry the cost: a service with
-- many costs must not grow the library's heap, which every collection walks); then a table
-- starts over.
local SETS, SET_COUNT, FLAGS, FLAG_COUNT, MEMO_MAX, FLAGS_MAX = {}, 0, {}, 0, 1000, 64

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
  -- fast: fast.lua's fast_check may decide it; log: it has a sliding log; width: its reply's
  -- length under the defaults.
  set = {tier = tier, fast = true, log = false, width = 3}
  local seen = {}
  for params, name in string.gmatch(string.sub(text, from), '\n([^ \n]*) ([^\n]*)') do
    local p = spec_of(params, name)
    if not p or seen[name] then return nil end
    seen[name] = true
    set[#set + 1] = p
    if p.alg == 5 then set.log = true end
    set.width = set.width + p.a.width
  end
  -- Every line read (a line without its space is skipped by gmatch, not matched).
  local _, lines = string.gsub(text, '\n', '\n')
  if lines ~= #set then return nil end
  -- fast_check's pattern of the whole state string: the header '0', then each policy's
  -- line in order (a Lua pattern holds at most 32 captures).
  if set.fast then
    local pat, captures = '^0', 0
    for i = 1, #set do
      pat, captures = pat .. set[i].pat, captures + set[i].a.fields
    end
    set.pat, set.none = pat .. '$', {}
    if captures > 32 then set.fast = false end
  end
  -- defaults: the fast path may decide this set when it is the defaults'.
  set.defaults = set.fast and tier == ''
  set.count = #set
  if SET_COUNT >= MEMO_MAX then SETS, SET_COUNT = {}, 0 end
  SETS[text], SET_COUNT = set, SET_COUNT + 1
  return set
end

-- ARGV[1]: {op, unconfigured, least TTL, cost = the cost, time = the time or nil (the
-- server's TIME), fast = a check under the defaults}, or nil when it is malformed. Texts
-- with an explicit time (simulations: one per call) are not kept.
local OPS = {check = true, refund = true, reset = true}
local MODES = {defaults = true, deny = true, allow = true}
local function flags_of(text)
  local op, mode, ttl, cost, time = match(text, '^(%l+) (%l+) (%d+) (%d+)(.*)$')
  if not op or not OPS[op] or not MODES[mode] then return nil end
  ttl, cost = nat(ttl), nat(cost)
  if not ttl or not cost then return nil end
  if time ~= '' then
    time = nat(match(time, '^ (%d+)$'))
    if not time then return nil end
  else
    time = nil
  end
  -- fast: a check under the defaults when the key has no configuration (see check)
  local f = {op, mode, ttl, cost = cost, time = time, fast = op == 'check' and mode == 'defaults'}
  if not time then
    if FLAG_COUNT >= FLAGS_MAX then FLAGS, FLAG_COUNT = {}, 0 end
    FLAGS[text], FLAG_COUNT = f, FLAG_COUNT + 1
  end
  return f
end

-- The policies of set, each given this call's fields: its key (its log's key only for a
-- sliding log: logkey_of), and no carried-over mark; every other field a call uses (o, st,
-- now, ok, ttl, and what decide leaves for admitted) is written by the call before it is
-- read. (Names are unique in a set, and one call uses one set.)
local function with_keys(set, base)
  for i = 1, #set do
    local p = set[i]
    p.base, p.key, p.carried = base, base .. FORMAT_SUFFIX, nil
    if p.alg == 5 then p.logkey = base .. p.logsuffix else p.logkey = nil end
  end
  return set
end

-- The set of tier in ARGV (tier nil: the defaults, ARGV[2]); false when no set has that
-- tier; nil and the argument's index for a malformed set.
local function find_set(ARGV, tier)
  if not tier then
    local set = ARGV[2] and set_of(ARGV[2])
    if not set or set.tier ~= '' then return nil, 2 end
    return set
  end
  for i = 3, #ARGV do
    local set = set_of(ARGV[i])
    if not set or set.tier == '' then return nil, i end
    if set.tier == tier then return set end
  end
  return false
end

-- A refund or a reset bumps the key's version (out[2]), once every state it needs was read
-- (an error reply changes nothing), and marks the state string at key as configured (see
-- states.lua: the fast path no longer decides from it alone).
local function bump(cfgkey, cfg, out, key)
  out[2] = redis.call('HINCRBY', cfgkey, 'v', 1)
  if not cfg[1] and not cfg[2] then
    -- A version alone is kept a day: long enough for anyone holding the old one to see it.
    redis.call('PEXPIRE', cfgkey, 86400000)
  end
  mark_configured(key)
end

-- refund: read every state (a sliding log's entries too) before anything changes, bump the
-- version, then as turnstile-core's refund: a carried-over state is stored (the old
-- parameters' state is gone), then cost units go back, if there are any to give (refund
-- returns nil when there is nothing: another window, an empty log). A state with nothing
-- left in use is dropped (a sliding log's list with it) — unless the clock (now) reads
-- earlier than its last update, whose time the refund took: then, as in memory, it is kept
-- (its time with it) until the clock passes that time. Sets each policy's line and TTL for
-- write_states. Returns an error, or nil.
local function refund_all(cfgkey, cfg, out, min_ttl, policies, cost, key, states, kept, now)
  local scratch = {}
  for i = 1, #policies do
    local p = policies[i]
    local ok, reset = p.a.decide(p, p.st, p.now, 0, scratch, 0)
    if ok == nil then return reset end
    -- Unchanged unless refunded below: kept as it is while in use.
    p.line, p.ttl = nil, ttl_of(min_ttl, reset)
    if states[p.name] and (reset > 0 or p.now > now) then p.line = '\n' .. states[p.name] .. '\t' .. p.name end
  end
  bump(cfgkey, cfg, out, key)
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
        p.line, p.ttl, p.st = '\n' .. a.encode(p.params, st) .. '\t' .. p.name,
          ttl_of(min_ttl, reset), st
      else
        -- nothing left in use: the state is fresh (a sliding log's list dropped); kept as a
        -- fresh state at its time while that is after the clock's
        if p.alg == 5 then redis.call('DEL', logkey_of(p)) end
        p.line, p.st = nil, a.fresh()
        if p.now > now then
          p.st = fresh_at(p, p.now)
          p.line, p.ttl = '\n' .. a.encode(p.params, p.st) .. '\t' .. p.name, ttl_of(min_ttl, 0)
        end
      end
    end
  end
  write_states(key, 'c', policies, kept)
  return nil
end

-- The key base "<prefix>:{<tag>}" of the state string's key (KEYS[1]: the base, ':' and the
-- format) is the one capture of BASE_OF.
local BASE_OF = '^(.+)' .. FORMAT_SUFFIX .. '$'

-- The configuration of a key whose state string says it has none.
local NO_CONFIG = {}

-- The configuration hash's key of the state string at key (fast_check's, for a fresh key),
-- or nil when key is not one (the general path reports it).
local function cfgkey_of(key)
  local base = match(key, BASE_OF)
  return base and base .. '~cfg'
end

-- The server's last TIME seconds (a string) and them in ms.
local TIME_S, TIME_MS = nil, 0

local function check(KEYS, ARGV)
  if not match then bind() end
  local text, key = ARGV[1], KEYS[1]
  local flags = FLAGS[text or false] or (text and flags_of(text))
  if not flags or not key then
    return redis.error_reply('TURNSTILE_ARGS malformed arguments')
  end
  local now, cost = flags.time, flags.cost
  if not now then
    -- The server's own reply, two decimal integers (seconds, microseconds): read by
    -- arithmetic directly, as nat would read them; the seconds' product is kept while they
    -- stay the same (the same text: one comparison of interned strings).
    local t = redis.call('TIME')
    local s, us = t[1], t[2] + 0
    if s ~= TIME_S then TIME_S, TIME_MS = s, s * 1000 end
    local r = us % 1000
    now = TIME_MS + (us - r) / 1000
  end

  -- The common case first (fast.lua): a check under the defaults' set (parsed before: its
  -- memo) of a key whose state string was written without configuration, or a fresh key
  -- without one; anything else, or fast_check's nil, takes the general path below.
  if flags.fast then
    -- (With EVALSHA the memo is empty at every call: the set is parsed here.)
    local set = SETS[ARGV[2]] or (ARGV[2] and set_of(ARGV[2]))
    if set and set.defaults then
      local out = fast_check(set, key, now, cost, flags[3], cfgkey_of)
      if out then return out end
    end
  end
  local op, mode, min_ttl = flags[1], flags[2], flags[3]

  local base = match(key, BASE_OF)
  if not base then return redis.error_reply('TURNSTILE_ARGS malformed key') end
  local cfgkey = base .. '~cfg'
  -- A check reads the state string first: one written without configuration (header '0')
  -- says there is none, as it does for the fast path (every change of the configuration
  -- marks it). A refund or a reset always reads the configuration (it changes it).
  local states, serr, cfg
  if op == 'check' then
    states, serr = read_states(key)
    if states and states.head == '0' then cfg = NO_CONFIG end
  end
  -- The key's configuration. One that cannot be read decides nothing, not even a reset
  -- (which policies apply is unknown): Quotas::clear_config (`turnstile quota rm`) removes
  -- it.
  local problem
  if not cfg then
    cfg = redis.pcall('HMGET', cfgkey, 'o', 't', 'v')
    if cfg.err then
      problem = 'not a hash (' .. cfg.err .. ')'
    elseif cfg[1] or cfg[2] or cfg[3] then
      problem = config_problem(cfg)
    end
  end
  if problem then
    return redis.error_reply('TURNSTILE_INVALID_STATE invalid configuration at ' .. cfgkey
      .. ': ' .. problem .. '; clearing the configuration (turnstile quota rm) removes it')
  end
  local version, head = 0, '0'
  if cfg[3] then version = cfg[3] + 0 end
  if cfg[1] or cfg[2] or cfg[3] then head = 'c' end

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
    if set then policies = with_keys(set, base) end
  end

  local out, o = {now, version, applied}, 3
  if tier then out[4], o = tier, 4 end
  if not policies then
    if op ~= 'check' then bump(cfgkey, cfg, out, key) end
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

  local kept
  if op == 'reset' then
    -- Forget the applying policies' states (their lines, and a sliding log's list), and
    -- nothing else: the other policies' states are kept as a check keeps them. A string
    -- that cannot be read (garbage, another type, a line that is not a state) is deleted
    -- as a whole: a reset repairs it.
    for i = 1, count do
      local p = policies[i]
      if p.alg == 5 then redis.call('DEL', logkey_of(p)) end
      p.st, p.now, p.line = p.a.fresh(), now, nil
    end
    bump(cfgkey, cfg, out, key)
    local states = read_states(key)
    local kept = states and others_of(key, base, states, policies, now, min_ttl)
    if kept then write_states(key, 'c', policies, kept) else redis.call('DEL', key) end
  else
    local err = serr
    if op ~= 'check' then states, err = read_states(key) end
    if not states then return redis.error_reply(err.err) end
    -- The other policies' states are read (strictly) too: they are kept.
    kept, err = others_of(key, base, states, policies, now, min_ttl)
    if not kept then return redis.error_reply(err.err) end
    for i = 1, count do
      local p = policies[i]
      local st = p.a.fresh()
      local text = states[p.name]
      if text then
        st = decode(key, p, text, now)
        if st.err then return redis.error_reply(st.err) end
      end
      -- A clock earlier than the key's last update: use the last update's time.
      p.st, p.now = st, now
      if st.updated > now then p.now = st.updated end
    end
  end

  if op == 'refund' then
    local err = refund_all(cfgkey, cfg, out, min_ttl, policies, cost, key, states, kept,
      now)
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
    if all then
      for i = 1, count do
        local p = policies[i]
        local st = p.a.admitted(p, p.st, p.now, c)
        p.line = '\n' .. p.a.encode(p.params, st) .. '\t' .. p.name
        p.ttl = ttl_of(min_ttl, p.ttl)
      end
      write_states(key, head, policies, kept)
    else
      for i = 1, count do
        local p = policies[i]
        if p.ok then
          -- Denied overall: report this policy as if nothing were consumed.
          local ok, err = p.a.decide(p, p.st, p.now, 0, out, p.o)
          if ok == nil then return redis.error_reply(err.err) end
          if p.alg == 3 then out[p.o + 4] = 0 end
        end
      end
    end
  end

  return out
end
