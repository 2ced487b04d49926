-- turnstile: a client key's state string (format f4, STATE_FORMAT in prelude.lua), read and
-- written by check's general path (general.lua; fast.lua reads and writes the common case
-- itself). Composed, with general.lua, inside general_path() (see general.lua's header): its
-- definitions run only when a call takes the general path (or once, when the Function
-- library loads).
--
-- Every policy state of one client key lives in ONE Redis string at
-- <prefix>:{<tag>}:f4 (KEYS[1] of check), so a check makes one GET and one SET whatever the
-- number of policies:
--
--   <header>\n<state>\t<name>\n<state>\t<name>...  (\t a tab, \n a line break)
--
-- header '0': written while the key had no configuration hash (no override, no tier, no
--             version): the fast path may decide from the string alone;
--        'c': written while it had one — or marked so since, by whatever changed the
--             configuration (config.lua's set and clear, a refund's or a reset's version
--             bump, all in the same atomic call): the general path reads the hash (HMGET).
-- state:      a policy's state as each algorithm encodes it, "alg.L.P.B|n|n..." (its
--             parameters first, so a state written under other parameters carries over by
--             the policy's name, see decode and carry below);
-- name:       the policy's name (printable ASCII: never a tab or a line break, so the
--             line's tab ends the state however it is spelled). Names are unique; at least
--             one line.
--
-- The string's TTL is the largest TTL any of its states needs (each state's reset_after
-- rounded up, at least the least TTL and 1 ms): no state is dropped before its reset_after.
-- A state of a policy that does not apply to this call (another tier's, say) is kept as it
-- is while it is still in use (its reset_after above 0), and its TTL counts; once it is
-- not, it is dropped (it reads as fresh). A sliding log's list (its own key, ~log:f4:<name>)
-- gets the string's TTL, so it never expires before its state.
--
-- Anything else at the key — another type, no header, a line that is not "<state> <name>",
-- a name twice, a state that no request leaves — is invalid state (TURNSTILE_INVALID_STATE),
-- never overwritten; a reset deletes the whole string.

-- The key of p's log (a sliding log's, or one another algorithm's policy of the same name
-- left).
local function logkey_of(p)
  return p.logkey or (p.base .. p.logsuffix)
end

-- The TTL of a key whose reset_after rounds up to reset ms: at least min_ttl and 1 ms.
local function ttl_of(min_ttl, reset)
  if reset < min_ttl then reset = min_ttl end
  if reset < 1 then return 1 end
  return reset
end

-- A fresh state of p's algorithm, last updated at t.
local function fresh_at(p, t)
  local f = p.a.fresh()
  f.updated = t
  return f
end

-- The state of p, in p's terms, from st stored under other parameters q (q.key and q.name
-- p's), at t (not before st's update): the rule of turnstile-core's algorithm::carry_over;
-- or the error when st is none a request leaves under q. What st holds at t under q (a
-- bucket's debt, a window's counts) is its algorithm's query (q.a.decide at cost 0, which
-- keeps them on q as q.v1, q.v2: see methods.lua).
local function carry(q, p, st, t)
  q.a = algorithm(q.alg)
  if q.alg ~= 5 then
    local ok, err = q.a.decide(q, st, t, 0, SCRATCH, 0)
    if ok == nil then return err end
  end
  if is_bucket(q.alg) and is_bucket(p.alg) then
    local units = min(ceildiv(q.v1, q.P), p.B)
    if units == 0 then return fresh_at(p, t) end
    return {updated = t, debt = units * p.P}
  elseif q.alg == 4 and p.alg == 4 then
    local w = divmod(t, p.P)
    if q.v1 == 0 or divmod(st.updated, p.P) ~= w then return fresh_at(p, t) end
    return {updated = t, w = w, n = min(q.v1, p.L)}
  elseif q.alg == 6 and p.alg == 6 then
    local n, m, w = q.v1, q.v2, divmod(t, p.P)
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

-- The state text (a line's state, see read_states) of p in p's terms, or an error
-- ({err = ...}, naming key) when it is anything the scripts do not write: other fields, a
-- number that is not one (see nat), a state no sequence of requests leaves. Sets p.carried
-- when the state was written under other parameters (and carried over).
local function decode(key, p, raw, now)
  local a = p.a
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
      return a.parse(p, n1, n2, n3, n4) or bad(key, 'the state of ' .. p.name)
    end
    return bad(key, 'the state of ' .. p.name)
  end
  -- Anything else: parameters written otherwise (carried over), or not a state at all.
  local parts = fields(raw, '|')
  local q = parse_params(parts[1])
  if not q or #parts ~= algorithm(q.alg).fields + 1 then
    return bad(key, 'the state of ' .. p.name)
  end
  local nums = {}
  for i = 2, #parts do
    nums[i - 1] = nat(parts[i])
    if not nums[i - 1] then return bad(key, 'the state of ' .. p.name) end
  end
  local st = algorithm(q.alg).parse(q, nums[1], nums[2], nums[3], nums[4])
  if not st then return bad(key, 'the state of ' .. p.name) end
  if q.alg == p.alg and q.L == p.L and q.P == p.P and q.B == p.B then return st end
  local t = now
  if st.updated > t then t = st.updated end
  p.carried = true
  q.key, q.name = p.key, p.name
  return carry(q, p, st, t)
end

-- The state string at key: {head = '0' or 'c', [name] = state text, the names in order}, an
-- empty table (no head) when there is none, or nil and the error. Each line is read with
-- one anchored match from where the last one ended. (A name is checked by others_of unless
-- it is an applying policy's, whose name the caller's own arguments gave.)
local function read_states(key)
  local raw = redis.pcall('GET', key)
  local states = {}
  if not raw then return states end
  if type(raw) ~= 'string' then return nil, bad(key, raw.err) end
  local head, at = match(raw, '^([0c])()\n')
  if not head then return nil, bad(key, 'not a state string') end
  states.head = head
  local size, n = #raw, 0
  while at <= size do
    local state, name, after = match(raw, '^\n([^\t\n]+)\t([^\n]+)()', at)
    if not state or states[name] then return nil, bad(key) end
    n = n + 1
    states[name], states[n], at = state, name, after
  end
  return states
end

-- A policy for a state's own parameters (the text before its first '|'), named name, with
-- its keys under base; or nil when they are not a policy's.
local function own_policy(base, name, state)
  local params = match(state, '^([^|]*)')
  local q = parse_params(params)
  if not q then return nil end
  q.name = name
  return keyed(base, q, params)
end

-- The TTL the state of a policy that does not apply to this call still needs at now (see
-- above): its own reset_after, rounded up, at least min_ttl; 0 when nothing of it is in use
-- (it is dropped) and its last update is not after now (a clock that reads earlier keeps
-- it, as memory does, until it passes the update). Or nil and the error when it is not a
-- state.
local function kept_ttl(key, base, name, state, now, min_ttl)
  local q = own_policy(base, name, state)
  if not q then return nil, bad(key, 'the state of ' .. name) end
  local st = decode(key, q, state, now)
  if st.err then return nil, st end
  local t = now
  if st.updated > t then t = st.updated end
  local ok, reset = q.a.decide(q, st, t, 0, SCRATCH, 0)
  if ok == nil then return nil, reset end
  if reset <= 0 and t == now then return 0 end
  return ttl_of(min_ttl, reset)
end

-- The states the string held (states) of every policy that does not apply to this call (not
-- in policies), each read strictly (kept_ttl): {their lines kept (in use), ttl = the
-- largest TTL they need (0: none), logs = their sliding logs' keys}; or nil and the error
-- when one is not a state. NONE_KEPT (never written to) when there is none.
local NONE_KEPT = {ttl = 0}
local function others_of(key, base, states, policies, now, min_ttl)
  local kept, mine = NONE_KEPT, {}
  -- The applying policies by name: one look-up per state (linear in the policies).
  for j = 1, #policies do mine[policies[j].name] = true end
  for i = 1, #states do
    local name = states[i]
    if not mine[name] then
      local state = states[name]
      if not valid_name(name) then return nil, bad(key, 'a policy name') end
      local ttl, err = kept_ttl(key, base, name, state, now, min_ttl)
      if not ttl then return nil, err end
      if ttl > 0 then
        if kept == NONE_KEPT then kept = {ttl = 0} end
        kept[#kept + 1] = '\n' .. state .. '\t' .. name
        if ttl > kept.ttl then kept.ttl = ttl end
        if find(state, '^5%.') then
          kept.logs = kept.logs or {}
          kept.logs[#kept.logs + 1] = base .. '~log:' .. STATE_FORMAT .. ':' .. name
        end
      end
    end
  end
  return kept
end

-- Writes the state string at key: head, then the lines of the policies given (each p.line,
-- with its TTL p.ttl; a nil line: p's state is dropped), then the other policies' lines
-- kept (others_of's answer), with the largest TTL of all. Deletes the key when no line is
-- left. Every sliding log in it gets the string's TTL.
local function write_states(key, head, policies, kept)
  -- Joined once (table.concat): growing the string a line at a time copies it per policy.
  local parts, most = {head}, kept.ttl
  for i = 1, #policies do
    local p = policies[i]
    if p.line then
      parts[#parts + 1] = p.line
      if p.ttl > most then most = p.ttl end
    end
  end
  for i = 1, #kept do parts[#parts + 1] = kept[i] end
  local value = table.concat(parts)
  if value == head then
    redis.call('DEL', key)
    return
  end
  -- The TTL passed as text ('%d': a number argument would be written with '%.17g', exact
  -- too, but several times the work).
  local ttl = format('%d', most)
  redis.call('SET', key, value, 'PX', ttl)
  for i = 1, #policies do
    local p = policies[i]
    if p.line and p.alg == 5 then redis.call('PEXPIRE', logkey_of(p), ttl) end
  end
  if kept.logs then
    for i = 1, #kept.logs do redis.call('PEXPIRE', kept.logs[i], ttl) end
  end
end
