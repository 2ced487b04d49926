-- turnstile: sliding log (id 5). A log of admitted (time, cost), one entry per distinct
-- millisecond; an entry logged at s expires at exactly s + P. used = the live entries' cost.
--
-- State at KEY: "alg.L.P.B|updated_ms|total", total = the cost of every entry in the list
-- (expired ones not yet pruned included); the log at LOGKEY (KEY's hash tag, '~log:', the
-- state format and the policy name): a list of "time:cost", oldest first.
--
-- s + P can pass 2^53 when s is near it: an entry is live iff now - s < P, and it expires
-- P - (now - s) ms from now (s <= updated_ms <= now).

local CHUNK = 128

-- One entry of st's log: its time and cost, or nil when there is none (s is nil), or nil
-- and an error when s is not an entry st's log can hold (cost 0, a time after st's last
-- update, anything but "digits:digits").
local function log_entry(p, st, s)
  if not s then return nil end
  local t, c = match(s, '^(%d+):(%d+)$')
  if t then t, c = t + 0, c + 0 end
  if not t or t > MAX_EXACT or c > MAX_EXACT or c < 1 or t > st.updated then
    return nil, nil, bad(p.logkey)
  end
  return t, c
end

-- The log's entries from index i on, CHUNK at a time, or nil and an error.
local function log_range(p, i)
  return read(p.logkey, 'LRANGE', p.logkey, i, i + CHUNK - 1)
end

-- The newest entry of the log, or nil, or nil and an error.
local function log_newest(p, st)
  local s, err = read(p.logkey, 'LINDEX', p.logkey, -1)
  if err then return nil, nil, err end
  return log_entry(p, st, s)
end

MAKE[5] = function() return {
  fresh = function() return {updated = 0, total = 0, fresh = true} end,
  parse = function(q, updated, total) return {updated = updated, total = total} end,
  -- Writes retry (-1: never), remaining and reset, in whole ms; nil and an error when the
  -- log cannot be read.
  decide = function(p, st, now, c, out, o)
    local L, P = p.L, p.P
    -- Count the expired prefix (entries with now - time >= P).
    local expired_n, expired_cost = 0, 0
    local live_from = nil -- list entries from this index on are live
    if not st.fresh then
      -- The oldest entry first: when it is live (the common case) nothing has expired, and no
      -- range is read; the walk below would have stopped at it too.
      local first, err = read(p.logkey, 'LINDEX', p.logkey, 0)
      if err then return nil, err end
      if first then
        local t, _, e = log_entry(p, st, first)
        if e then return nil, e end
        if now - t < P then live_from = 0 end
      end
      local i = 0
      while not live_from do
        local chunk, err = log_range(p, i)
        if err then return nil, err end
        -- The log's entries add up to total: no log, no total.
        if i == 0 and #chunk == 0 and st.total > 0 then return nil, bad(p.logkey, 'no log') end
        if #chunk == 0 then break end
        for j = 1, #chunk do
          local t, cost, e = log_entry(p, st, chunk[j])
          if e then return nil, e end
          if now - t < P then live_from = i + j - 1; break end
          expired_n, expired_cost = expired_n + 1, expired_cost + cost
        end
        i = i + CHUNK
      end
    end
    if expired_cost > st.total then return nil, bad(p.key, 'total below the log') end
    local used = st.total - expired_cost
    local newest, newest_cost = nil, nil
    if live_from then
      local t, cost, err = log_newest(p, st)
      if err then return nil, err end
      newest, newest_cost = t, cost
    end
    -- The newest entry, for admitted (which follows this decide, the log unchanged but for
    -- its expired prefix: the newest stays, or there is none).
    p.newest, p.newest_cost = newest, newest_cost
    -- an entry logged at t expires P - (now - t) ms from now
    local reset = 0
    if newest then reset = P - (now - newest) end
    local rem = L - used
    if rem < 0 then rem = 0 end
    local retry = -1
    if c == 0 then
      retry = 0
    elseif c <= L then
      if used <= L - c then
        out[o + 1], out[o + 2], out[o + 3] = 0, L - used - c, P
        p.prune, p.total = expired_n, used + c
        return true, P
      end
      -- Walk the live entries oldest first until the freed cost covers the need.
      -- (The live entries add up to used >= need: a walk that ends short is a total above
      -- the log's, a state no requests leave.)
      local need = used + c - L
      local freed = 0
      local i = live_from
      while i do
        local chunk, err = log_range(p, i)
        if err then return nil, err end
        if #chunk == 0 then break end
        for j = 1, #chunk do
          local t, cost, e = log_entry(p, st, chunk[j])
          if e then return nil, e end
          freed = freed + cost
          if freed >= need then retry = P - (now - t); i = nil; break end
        end
        if i then i = i + CHUNK end
      end
      if retry == -1 then return nil, bad(p.key, 'total above the log') end
    end
    out[o + 1], out[o + 2], out[o + 3] = retry, rem, reset
    return retry == 0, reset
  end,
  -- Writes the log itself; returns the state to store at KEY. decide has just read the log
  -- (its newest live entry included: p.newest) without error.
  admitted = function(p, st, now, c)
    if st.fresh then
      -- no state (or another algorithm's): drop whatever log is left
      redis.call('DEL', p.logkey)
    elseif p.prune > 0 then
      redis.call('LTRIM', p.logkey, p.prune, -1)
    end
    local t, cost = p.newest, p.newest_cost
    if t == now then
      redis.call('LSET', p.logkey, -1, int(now) .. ':' .. int(cost + c))
    else
      redis.call('RPUSH', p.logkey, int(now) .. ':' .. int(c))
    end
    return {updated = now, total = p.total}
  end,
  -- Shrinks the newest live entries first; writes the log itself. decide has read the log
  -- without error.
  refund = function(p, st, now, c)
    if st.fresh then return nil end
    local rest, total = c, st.total
    while rest > 0 do
      local t, cost = log_newest(p, st)
      if not t or now - t >= p.P then break end
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
  encode = function(params, st) return format('%s|%d|%d', params, st.updated, st.total) end,
} end
