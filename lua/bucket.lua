-- turnstile: token bucket (id 1) and leaky bucket (id 3).
--
-- State at KEY: "alg.L.P.B|updated_ms|debt", debt D = (B - x) * P for x tokens held
-- (token bucket) or D = y * P for y units queued (leaky bucket): an integer in units of
-- 1/L ms, relative to updated_ms. A refill over d ms subtracts d * L, capped so the product
-- stays below D. Admit iff D <= (B - c) * P, then D += c * P.

-- The debt of a bucket state (token, leaky or GCRA, under parameters q) at now, which is
-- not before the state's last update: at most B * P, and no intermediate above it.
local function debt_now(q, st, now)
  local elapsed = now - st.updated
  local D
  if q.alg == 2 then
    -- TAT - now = (ahead - elapsed) + frac / L, with 0 <= frac < L: negative (nothing owed)
    -- once elapsed > ahead.
    if elapsed > st.ahead then return 0 end
    D = (st.ahead - elapsed) * q.L + st.frac
  else
    D = st.debt
    if elapsed >= ceildiv(D, q.L) then return 0 end
    D = D - elapsed * q.L
  end
  return min(D, q.B * q.P)
end

-- Shared by the buckets and GCRA: the decision on a debt D (already refilled to now).
local function debt_decide(p, D, c, leaky)
  local L, P, B = p.L, p.P, p.B
  if c > B then return result(0, B - ceildiv(D, P), nil, dur(D, L)) end
  local delay = ZERO
  if leaky then delay = dur(D, L) end
  if c == 0 then return result(1, B - ceildiv(D, P), ZERO, dur(D, L), delay) end
  local room = (B - c) * P
  if D <= room then
    local after = D + c * P
    local r = result(1, B - ceildiv(after, P), ZERO, dur(after, L), delay)
    r.after = after
    return r
  end
  return result(0, B - ceildiv(D, P), dur(D - room, L), dur(D, L))
end

-- A bucket state of policy p holding debt D at now. The GCRA's TAT is kept relative to now
-- (now + ahead + frac / L), never as an absolute time: that would pass 2^53 when now is near
-- it.
local function debt_state(p, D, now)
  if p.alg == 2 then
    local ahead, f = divmod(D, p.L)
    return {updated = now, ahead = ahead, frac = f}
  end
  return {updated = now, debt = D}
end

local function bucket(leaky)
  return {
    fields = 2,
    fresh = function() return {updated = 0, debt = 0} end,
    parse = function(q, updated, debt)
      if debt > q.B * q.P then return nil end
      return {updated = updated, debt = debt}
    end,
    decide = function(p, st, now, c)
      return debt_decide(p, debt_now(p, st, now), c, leaky)
    end,
    admitted = function(p, st, now, r) return debt_state(p, r.after, now) end,
    refund = function(p, st, now, c)
      local D = debt_now(p, st, now) - min(c, p.B) * p.P
      if D < 0 then D = 0 end
      return debt_state(p, D, now)
    end,
    encode = function(params, st) return format('%s|%.0f|%.0f', params, st.updated, st.debt) end,
  }
end

MAKE[1] = function() return bucket(false) end
MAKE[3] = function() return bucket(true) end
