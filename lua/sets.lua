-- turnstile: check's arguments parsed (check.lua's header gives their layout): ARGV[1] into
-- its flags (flags_of), a policy set's argument into its policies (set_of), each policy made
-- ready for both paths (keyed, and fast.lua's fast_spec); and the keys derived from the
-- state string's.
--
-- Composed after prelude.lua, the algorithms' arithmetic, outcome.lua and fast.lua, before
-- the general path (inside general_path: reading.lua, the algorithms' methods, states.lua
-- and general.lua) and check.lua: what the common case needs is defined here, at the top
-- level, and what only the general path needs there.

-- Every piece below is a top-level function taking what it needs as arguments: a call creates
-- no closure.

-- A policy with its keys: an override's (see parse_override) or a spec's. params is the text
-- its state begins with: the arguments as they came when they are canonical (no leading zero:
-- the id, L, P and B are at least 1), else rewritten.
local function keyed(base, p, params)
  p.base = base
  p.a = algorithm(p.alg)
  p.params = params or (int(p.alg) .. '.' .. int(p.L) .. '.' .. int(p.P) .. '.' .. int(p.B))
  p.logsuffix = '~log:' .. STATE_FORMAT .. ':' .. p.name
  p.key = base .. FORMAT_SUFFIX
  p.logkey = base .. p.logsuffix
  return p
end

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
-- or nil when it is malformed (a policy that is none, a name twice), and then true when it
-- holds more than MAX_POLICIES policies. The policies are the calls' own tables: check gives
-- each its keys for the call (see with_keys). Linear in the set's size.
local function set_of(text)
  local set = SETS[text]
  if set then return set end
  local tier, from = match(text, '^([^\n]*)()')
  if tier ~= '' and not valid_tier(tier) then return nil end
  -- More lines than MAX_POLICIES: refused before any is parsed (one plain find per line).
  local at = from
  for _ = 0, MAX_POLICIES do
    at = find(text, '\n', at, true)
    if not at then break end
    at = at + 1
  end
  if at then return nil, true end
  -- log: its sliding logs' policies (false: none).
  set = {tier = tier, log = false}
  -- Each policy's place in fast_check's compact reply (fo) and captures (fk).
  local o, k = 1, 1
  -- Each line read with one anchored match from where the last one ended (no copy of the
  -- text, no count of its lines after): a line without its space matches nothing.
  local seen, size = {}, #text
  while from <= size do
    local params, name, after = match(text, '^\n([^ \n]*) ([^\n]*)()', from)
    if not params then return nil end
    local p = spec_of(params, name)
    if not p or seen[name] then return nil end
    seen[name] = true
    set[#set + 1] = p
    if p.alg == 5 then
      set.log = set.log or {}
      set.log[#set.log + 1] = p
    end
    p.fo, p.fk, o, k = o, k, o + p.a.width, k + p.a.fields
    from = after
  end
  -- fast_check's pattern of the whole state string: the header '0', then each policy's
  -- line in order. fast: fast.lua's fast_check may decide the set (a Lua pattern holds at
  -- most 32 captures: k - 1).
  -- (Made only for such a set: joined once, not grown a policy at a time.)
  set.fast = k <= 33
  if set.fast then
    local pat = {'^0'}
    for i = 1, #set do pat[i + 1] = set[i].pat end
    pat[#set + 2] = '$'
    set.pat = table.concat(pat)
  end
  -- fast_check's compact reply (o values: the head, then each policy's), made once per set
  -- and filled by every call (fast_check writes every value before it returns it; Redis
  -- reads a reply when the call returns, before any other call runs: no table made per
  -- call), and for several policies a fresh key's captures (none: zeros).
  local reply
  if o == 4 then
    reply = {0, 0, 0, 0}
  elseif o == 6 then
    reply = {0, 0, 0, 0, 0, 0}
  else
    reply = {}
    for i = 1, o do reply[i] = 0 end
  end
  set.reply = reply
  if #set > 1 then
    local none = {}
    for i = 1, k do none[i] = 0 end
    set.none = none
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
local MODES = {defaults = true, deny = true, allow = true, stored = true}
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

-- The key base "<prefix>:{<tag>}" of the state string's key (KEYS[1]: the base, ':' and the
-- format) is the one capture of BASE_OF.
local BASE_OF = '^(.+)' .. FORMAT_SUFFIX .. '$'

-- The configuration hash's key of the state string at key (fast_check's, for a fresh key),
-- or nil when key is not one (the general path reports it).
local function cfgkey_of(key)
  local base = match(key, BASE_OF)
  return base and base .. '~cfg'
end
