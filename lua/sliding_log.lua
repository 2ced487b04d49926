-- turnstile: sliding log (id 5). A log of admitted (time, cost), one entry per distinct
-- millisecond; an entry logged at s expires at exactly s + P. used = the live entries' cost.
--
-- State at KEY: "alg.L.P.B|updated_ms|total", total = the cost of every entry in the list
-- (expired ones not yet pruned included); the log at LOGKEY (KEY's hash tag, '~log:' and
-- the policy name): a list of "time:cost", oldest first.

local CHUNK = 128

local function log_entry(s)
  local t, c = string.match(s or '', '^(%d+):(%d+)$')
  return tonumber(t), tonumber(c)
end

ALG[5] = {
  fields = 2,
  fresh = function() return {updated = 0, total = 0, fresh = true} end,
  parse = function(q, n) return {updated = n[1], total = n[2]} end,
  decide = function(p, st, now, c)
    local L, P = p.L, p.P
    -- Count the expired prefix (entries with time + P <= now).
    local expired_n, expired_cost = 0, 0
    local live_from = nil -- list entries from this index on are live
    if not st.fresh then
      local i = 0
      while not live_from do
        local chunk = redis.call('LRANGE', p.logkey, i, i + CHUNK - 1)
        if #chunk == 0 then break end
        for j = 1, #chunk do
          local t, cost = log_entry(chunk[j])
          if not t then return bad(p.logkey) end
          if t + P > now then live_from = i + j - 1; break end
          expired_n, expired_cost = expired_n + 1, expired_cost + cost
        end
        i = i + CHUNK
      end
    end
    local used = st.total - expired_cost
    if used < 0 then used = 0 end
    local newest = nil
    if live_from then newest = log_entry(redis.call('LINDEX', p.logkey, -1)) end
    local function until_expiry(t) return dur_ms(t + P - now) end
    local reset = ZERO
    if newest then reset = until_expiry(newest) end
    local rem = L - used
    if rem < 0 then rem = 0 end
    if c > L then return result(0, rem, nil, reset) end
    if c == 0 then return result(1, rem, ZERO, reset) end
    if used <= L - c then
      local r = result(1, L - used - c, ZERO, until_expiry(now))
      r.prune, r.total = expired_n, used + c
      return r
    end
    -- Walk the live entries oldest first until the freed cost covers the need.
    local need = used + c - L
    local freed, retry = 0, reset
    local i = live_from
    while i do
      local chunk = redis.call('LRANGE', p.logkey, i, i + CHUNK - 1)
      if #chunk == 0 then break end
      for j = 1, #chunk do
        local t, cost = log_entry(chunk[j])
        if not t then return bad(p.logkey) end
        freed = freed + cost
        if freed >= need then retry = until_expiry(t); i = nil; break end
      end
      if i then i = i + CHUNK end
    end
    return result(0, rem, retry, reset)
  end,
  -- Writes the log itself; returns the state to store at KEY.
  admitted = function(p, st, now, r, c)
    if st.fresh then
      -- no state (or another algorithm's): drop whatever log is left
      redis.call('DEL', p.logkey)
    elseif r.prune > 0 then
      redis.call('LTRIM', p.logkey, r.prune, -1)
    end
    local t, cost = log_entry(redis.call('LINDEX', p.logkey, -1))
    if t == now then
      redis.call('LSET', p.logkey, -1, int(now) .. ':' .. int(cost + c))
    else
      redis.call('RPUSH', p.logkey, int(now) .. ':' .. int(c))
    end
    return {updated = now, total = r.total}
  end,
  -- Shrinks the newest live entries first; writes the log itself.
  refund = function(p, st, now, c)
    if st.fresh then return nil end
    local rest, total = c, st.total
    while rest > 0 do
      local t, cost = log_entry(redis.call('LINDEX', p.logkey, -1))
      if not t or t + p.P <= now then break end
      local take = min(rest, cost)
      if take == cost then
        redis.call('RPOP', p.logkey)
      else
        redis.call('LSET', p.logkey, -1, int(t) .. ':' .. int(cost - take))
      end
      total, rest = total - take, rest - take
    end
    return {updated = now, total = total}
  end,
  encode = function(st) return int(st.updated) .. '|' .. int(st.total) end,
}
