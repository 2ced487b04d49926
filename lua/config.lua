-- turnstile: read or change one client key's configuration (its override and its tier).
--
-- Composed after prelude.lua. It defines config(KEYS, ARGV), which the Rust side composes
-- into the Redis Function library (with check.lua's check) and into the EVALSHA script (the
-- definitions, then `return config(KEYS, ARGV)`).
--
-- KEYS[1] the key's configuration hash: o = override (lines "alg L P B name"), t = tier,
--         v = version
-- ARGV[1] 'get'; 'set' to change one field; or 'clear' to remove the override and the tier
-- ARGV[2] with 'set': the field, 'o' or 't'
-- ARGV[3] with 'set': its new value, or '' to remove it
--
-- A change bumps the version and marks the key's state string (KEYS[1] without '~cfg', then
-- ':' and the state format) as written with a configuration, so the next check reads it. A configured key (with o or t) never expires; one holding
-- only a version expires after a day.
--
-- 'get' and 'set' refuse a configuration that cannot be read (TURNSTILE_INVALID_STATE: a key
-- of another type, or a field that is not what the scripts write; see config_problem in
-- prelude.lua). 'clear' forgets whatever the key holds, so it repairs such a key: the
-- version goes on from the stored one when that can be read, else from 0.
--
-- Returns {override or '', tier or '', version}.

-- A client key's configuration hash: HMGET's reply for o, t, v (false where absent), or
-- nil and why it cannot be read (a key of another type). (Only here: check's general path
-- reads the hash itself.)
local function read_config(key)
  local cfg = redis.pcall('HMGET', key, 'o', 't', 'v')
  if cfg.err then return nil, 'not a hash (' .. cfg.err .. ')' end
  return cfg
end

-- The state string of the configuration at key (<base>~cfg: <base>:<format>) marked as
-- written with a configuration (mark_configured in prelude.lua), after every change.
local function mark_state(key)
  local base = match(key, '^(.*)~cfg$')
  if base then mark_configured(base .. FORMAT_SUFFIX) end
end

-- The body is not indented, so that it reads (and diffs) as the script it was.
local function config(KEYS, ARGV)
if not match then bind() end
local op, key = ARGV[1], KEYS[1]
if op ~= 'get' and op ~= 'set' and op ~= 'clear' then
  return redis.error_reply('TURNSTILE_ARGS unknown operation')
end
if op == 'clear' then
  local version = 0
  local v = redis.pcall('HGET', key, 'v')
  if type(v) == 'string' then version = nat(v) or 0 end
  version = version + 1
  redis.call('DEL', key)
  redis.call('HSET', key, 'v', int(version))
  redis.call('PEXPIRE', key, 86400000)
  mark_state(key)
  return {'', '', version}
end

local cfg, problem = read_config(key)
if not problem then problem = config_problem(cfg) end
if problem then
  return redis.error_reply('TURNSTILE_INVALID_STATE invalid configuration at ' .. key .. ': '
    .. problem .. '; clearing the configuration (turnstile quota rm) removes it')
end
local version = nat(cfg[3] or '0')

if op == 'set' then
  local field, value = ARGV[2], ARGV[3]
  if field ~= 'o' and field ~= 't' then
    return redis.error_reply('TURNSTILE_ARGS unknown configuration field')
  end
  if (field == 'o' and value ~= '' and not parse_override(value))
     or (field == 't' and value ~= '' and not valid_tier(value)) then
    return redis.error_reply('TURNSTILE_ARGS invalid ' .. field)
  end
  if value == '' then
    redis.call('HDEL', key, field)
  else
    redis.call('HSET', key, field, value)
  end
  version = redis.call('HINCRBY', key, 'v', 1)
  cfg = redis.call('HMGET', key, 'o', 't')
  if cfg[1] or cfg[2] then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIRE', key, 86400000)
  end
  mark_state(key)
end
return {cfg[1] or '', cfg[2] or '', version}
end
