-- turnstile: read or change one client key's configuration (its override and its tier).
--
-- KEYS[1] the key's configuration hash: o = override (lines "alg L P B name"), t = tier,
--         v = version
-- ARGV[1] 'get'; 'set' to change one field; or 'clear' to remove the override and the tier
-- ARGV[2] with 'set': the field, 'o' or 't'
-- ARGV[3] with 'set': its new value, or '' to remove it
--
-- A change bumps the version. A configured key (with o or t) never expires; one holding
-- only a version expires after a day.
--
-- Returns {override or '', tier or '', version}.

if ARGV[1] == 'set' or ARGV[1] == 'clear' then
  if ARGV[1] == 'clear' then
    redis.call('HDEL', KEYS[1], 'o', 't')
  else
    local field = ARGV[2]
    if field ~= 'o' and field ~= 't' then
      return redis.error_reply('TURNSTILE_ARGS unknown configuration field')
    end
    if ARGV[3] == '' then
      redis.call('HDEL', KEYS[1], field)
    else
      redis.call('HSET', KEYS[1], field, ARGV[3])
    end
  end
  redis.call('HINCRBY', KEYS[1], 'v', 1)
  if redis.call('HEXISTS', KEYS[1], 'o') == 1 or redis.call('HEXISTS', KEYS[1], 't') == 1 then
    redis.call('PERSIST', KEYS[1])
  else
    redis.call('PEXPIRE', KEYS[1], 86400000)
  end
elseif ARGV[1] ~= 'get' then
  return redis.error_reply('TURNSTILE_ARGS unknown operation')
end
local cfg = redis.call('HMGET', KEYS[1], 'o', 't', 'v')
return {cfg[1] or '', cfg[2] or '', tonumber(cfg[3] or '0')}
