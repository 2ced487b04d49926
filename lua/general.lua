-- turnstile: check's general path (check.lua): everything but the common case that fast.lua
-- decides — a refund, a reset, a configured key (override, tier, the unconfigured
-- behaviour), a state under other parameters (carried over), another set, a state that
-- cannot be read (reported), or anything fast_check leaves (its nil).
--
-- Composed inside general_path() (wire/compose.rs writes its first and last lines), after
-- reading.lua, the algorithms' methods (methods.lua, log_list.lua: METHODS[id], see ALG in
-- prelude.lua) and states.lua. general_path returns general. Its definitions run
-- only when general_path runs (Lua creates a function's inner closures and tables when the
-- function runs, not when it is defined): check builds it the first time a call needs it.
-- With EVALSHA, where every call runs the whole script again, a call the fast path decides
-- then creates none of them; the Function library builds it once, at FUNCTION LOAD (see
-- wire/compose.rs), and keeps it.
--
-- Every piece below is a function of general_path taking what it needs as arguments: a
-- call of general creates no closure.

-- The policies of set, each given this call's fields: its key (its log's key only for a
-- sliding log: logkey_of), and no carried-over mark; every other field a call uses (o, st,
-- now, ok, ttl, and what decide leaves for admitted) is written by the call before it is
-- read. (Names are unique in the list a call uses: one per default policy.)
local function with_keys(set, base)
  for i = 1, #set do
    local p = set[i]
    -- Its algorithm's methods (p.a is ALG[p.alg], parsed maybe before general_path ran).
    algorithm(p.alg)
    p.base, p.key, p.carried = base, base .. FORMAT_SUFFIX, nil
    if p.alg == 5 then p.logkey = base .. p.logsuffix else p.logkey = nil end
  end
  return set
end

-- The set of tier in ARGV (tier nil: the defaults, ARGV[2]); false when no set has that
-- tier; nil and the argument's index for a malformed set (and true when it holds more than
-- MAX_POLICIES policies).
local function find_set(ARGV, tier)
  if not tier then
    local set, many = nil, nil
    if ARGV[2] then set, many = set_of(ARGV[2]) end
    if not set or set.tier ~= '' then return nil, 2, many end
    return set
  end
  for i = 3, #ARGV do
    local set, many = set_of(ARGV[i])
    if not set or set.tier == '' then return nil, i, many end
    if set.tier == tier then return set end
  end
  return false
end

-- The error reply for the malformed set at argument i (many: it holds too many policies).
local function set_error(i, many)
  if many then
    return redis.error_reply('TURNSTILE_TOO_MANY_POLICIES argument ' .. i
      .. ' holds more than ' .. MAX_POLICIES .. ' policies')
  end
  return redis.error_reply('TURNSTILE_ARGS malformed set ' .. i)
end

-- The policies of a set (a list) by name.
local function by_name(set)
  local t = {}
  for i = 1, #set do t[set[i].name] = set[i] end
  return t
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
  for i = 1, #policies do
    local p = policies[i]
    -- (This query is what p's refund below starts from: see methods.lua.)
    local ok, reset = p.a.decide(p, p.st, p.now, 0, SCRATCH, 0)
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
      local ok, reset = a.decide(p, st, p.now, 0, SCRATCH, 0)
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

-- The configuration of a key whose state string says it has none.
local NO_CONFIG = {}

-- The key's configuration (HMGET's o, t, v) for op, and for a check the state string it
-- read first (read_states' answer and error); or nil and the error reply. A check reads the
-- state string first: one written without configuration (header '0') says there is none,
-- as it does for the fast path (every change of the configuration marks it). A refund or a
-- reset always reads the configuration (it changes it). One that cannot be read decides
-- nothing, not even a reset (which policies apply is unknown): Quotas::clear_config
-- (`turnstile quota rm`) removes it.
local function configuration(op, key, cfgkey)
  local states, serr, cfg
  if op == 'check' then
    states, serr = read_states(key)
    if states and states.head == '0' then return NO_CONFIG, states, serr end
  end
  local problem
  cfg = redis.pcall('HMGET', cfgkey, 'o', 't', 'v')
  if cfg.err then
    problem = 'not a hash (' .. cfg.err .. ')'
  elseif cfg[1] or cfg[2] or cfg[3] then
    problem = config_problem(cfg)
  end
  if problem then
    return nil, redis.error_reply('TURNSTILE_INVALID_STATE invalid configuration at ' .. cfgkey
      .. ': ' .. problem .. '; clearing the configuration (turnstile quota rm) removes it')
  end
  return cfg, states, serr
end

-- Which policies apply under cfg, per policy (turnstile-core's quota::resolve is its twin):
-- for each default policy (ARGV[2]), the override's policy of its name, else the key's
-- tier's (a set ARGV carries), else the default itself ('stored' mode: none). A key with
-- neither an override nor a tier ARGV carries gets the unconfigured behaviour (mode).
-- Returns the policies (nil: none apply), applied (see check.lua's header: 1 when some
-- policy is the override's, else 2 when some is the tier's, else 0), and when applied is 1
-- or 2 the tier's name ('' for none) and each default's mark (-1 none, 0 the default, 1 the
-- override's, 2 the tier's); or false and the error reply. Linear in the policies.
local function applying(ARGV, cfg, mode, base)
  local defaults, bad_at, many = find_set(ARGV, nil)
  if not defaults then return false, set_error(bad_at, many) end
  local over, listed, tier = nil, nil, nil
  if cfg[1] then
    local policies = parse_override(cfg[1])
    for _, p in ipairs(policies) do keyed(base, p) end
    over = by_name(policies)
  end
  if cfg[2] then
    local set
    set, bad_at, many = find_set(ARGV, cfg[2])
    if set == nil then return false, set_error(bad_at, many) end
    if set then listed, tier = by_name(set), cfg[2] end
  end
  if not over and not listed then
    if mode == 'deny' then return nil, 3 end
    if mode == 'allow' or mode == 'stored' then return nil, 4 end
    return with_keys(defaults, base), 0
  end
  local policies, marks, applied = {}, {}, 0
  for i = 1, #defaults do
    local name, p, s = defaults[i].name, nil, -1
    if over then p = over[name] end
    if p then
      s, applied = 1, 1
    else
      if listed then p = listed[name] end
      if p then
        s = 2
        if applied == 0 then applied = 2 end
      elseif mode ~= 'stored' then
        p, s = defaults[i], 0
      end
    end
    marks[i] = s
    if p then policies[#policies + 1] = p end
  end
  if #policies == 0 then return nil, 4 end
  if applied == 0 then return with_keys(policies, base), 0 end
  return with_keys(policies, base), applied, tier or '', marks
end

-- Where each policy's values go in the reply out, from o on (p.o). With marks (applied 1 or
-- 2), per default policy its mark, then for the override's its parameters and name (the
-- caller does not know them), then its result (none for mark -1); else each result.
local function layout(out, o, policies, marks)
  if not marks then
    for i = 1, #policies do
      local p = policies[i]
      p.o = o
      o = o + p.a.width
    end
    return
  end
  local j = 1
  for i = 1, #marks do
    local s = marks[i]
    o = o + 1
    out[o] = s
    if s >= 0 then
      local p = policies[j]
      j = j + 1
      if s == 1 then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = p.alg, p.L, p.P, p.B, p.name
        o = o + 5
      end
      p.o = o
      o = o + p.a.width
    end
  end
end

-- reset: forget the applying policies' states (their lines, and a sliding log's list), and
-- nothing else: the other policies' states are kept as a check keeps them. A string that
-- cannot be read (garbage, another type, a line that is not a state) is deleted as a whole:
-- a reset repairs it. Then each policy reads as fresh.
local function reset_all(cfgkey, cfg, out, key, base, policies, now, min_ttl)
  for i = 1, #policies do
    local p = policies[i]
    if p.alg == 5 then redis.call('DEL', logkey_of(p)) end
    p.st, p.now, p.line = p.a.fresh(), now, nil
  end
  bump(cfgkey, cfg, out, key)
  local states = read_states(key)
  local kept = states and others_of(key, base, states, policies, now, min_ttl)
  if kept then write_states(key, 'c', policies, kept) else redis.call('DEL', key) end
end

-- Each applying policy's state (p.st, in its terms) and the time it is decided at (p.now:
-- now, or its last update when the clock reads earlier), from the string's lines (states);
-- returns the other policies' lines kept (others_of), or nil and the error.
local function read_applying(key, base, states, policies, now, min_ttl)
  -- The other policies' states are read (strictly) too: they are kept.
  local kept, err = others_of(key, base, states, policies, now, min_ttl)
  if not kept then return nil, err end
  for i = 1, #policies do
    local p = policies[i]
    local st = p.a.fresh()
    local text = states[p.name]
    if text then
      st = decode(key, p, text, now)
      if st.err then return nil, st end
    end
    p.st, p.now = st, now
    if st.updated > now then p.now = st.updated end
  end
  return kept
end

-- Decides every policy for cost c (0: a query) into out; when all admit c > 0 stores their
-- states (with the other policies' lines kept), else applies the all-or-nothing rule.
-- Returns an error, or nil.
local function decide_all(key, head, policies, kept, c, out, min_ttl)
  local count, all = #policies, true
  for i = 1, count do
    local p = policies[i]
    local ok, ttl = p.a.decide(p, p.st, p.now, c, out, p.o)
    if ok == nil then return ttl end
    if not ok then all = false end
    p.ok, p.ttl = ok, ttl
  end
  if c == 0 then return nil end
  if not all then return as_if_nothing_consumed(policies, count, out, false) end
  for i = 1, count do
    local p = policies[i]
    local st = p.a.admitted(p, p.st, p.now, c)
    p.line = '\n' .. p.a.encode(p.params, st) .. '\t' .. p.name
    p.ttl = ttl_of(min_ttl, p.ttl)
  end
  write_states(key, head, policies, kept)
  return nil
end

-- The general path of a call of check (its reply or error reply, as check.lua's header gives
-- them), once check has read its flags (flags_of's answer), the state string's key (KEYS[1])
-- and the time now (ms); ARGV is check's (the policy sets).
local function general(ARGV, key, flags, now)
  local op, mode, min_ttl, cost = flags[1], flags[2], flags[3], flags.cost
  local base = match(key, BASE_OF)
  if not base then return redis.error_reply('TURNSTILE_ARGS malformed key') end
  local cfgkey = base .. '~cfg'
  local cfg, states, err = configuration(op, key, cfgkey)
  if not cfg then return states end
  local version, head = 0, '0'
  if cfg[3] then version = cfg[3] + 0 end
  if cfg[1] or cfg[2] or cfg[3] then head = 'c' end
  local policies, applied, tier, marks = applying(ARGV, cfg, mode, base)
  if policies == false then return applied end

  local out, o = {now, version, applied}, 3
  if marks then out[4], o = tier, 4 end
  if not policies then
    if op ~= 'check' then bump(cfgkey, cfg, out, key) end
    return out
  end
  layout(out, o, policies, marks)
  local kept, c = nil, cost
  if op == 'reset' then
    reset_all(cfgkey, cfg, out, key, base, policies, now, min_ttl)
    c = 0
  else
    if op ~= 'check' then states, err = read_states(key) end
    if not states then return redis.error_reply(err.err) end
    kept, err = read_applying(key, base, states, policies, now, min_ttl)
    if not kept then return redis.error_reply(err.err) end
    if op == 'refund' then
      err = refund_all(cfgkey, cfg, out, min_ttl, policies, cost, key, states, kept, now)
      if err then return redis.error_reply(err.err) end
      c = 0
    end
  end
  -- refund and reset answer as a query made after them
  err = decide_all(key, head, policies, kept, c, out, min_ttl)
  if err then return redis.error_reply(err.err) end
  return out
end
