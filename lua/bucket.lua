-- turnstile: token bucket (id 1) and leaky bucket (id 3).
--
-- State at KEY: "alg.L.P.B|updated_ms|debt", debt D = (B - x) * P for x tokens held
-- (token bucket) or D = y * P for y units queued (leaky bucket): an integer in units of
-- 1/L ms, relative to updated_ms. A refill over d ms subtracts d * L, capped so the product
-- stays below D. Admit iff D <= (B - c) * P, then D += c * P.

-- The debt of a bucket state (token, leaky or GCRA, under parameters q) at now, which is
-- not before the state's last update: at most B * P, and no intermediate above it.
local function debt_now(q, st, now)
  local D = st.debt
  if now - st.updated >= ceildiv(D, q.L) then return 0 end
  return min(D - (now - st.updated) * q.L, q.B * q.P)
end

-- Shared by the buckets and GCRA: the decision on a debt D (already refilled to now),
-- written at out[o + 1 ..]: retry (-1: never), remaining, reset, and for the leaky bucket
-- delay, each duration as its numerator over L (D / L ms and the like: exact, at most
-- B * P). Returns whether it admits and reset_after in whole ms rounded up; p.after is the
-- debt to store when it admits c > 0.
local function debt_decide(p, D, c, leaky, out, o)
  local L, P, B = p.L, p.P, p.B
  local retry, after, delay = -1, D, 0
  if c == 0 then
    retry, delay = 0, D
  elseif c <= B then
    local room = (B - c) * P
    if D <= room then
      after = D + c * P
      retry, delay, p.after = 0, D, after
    else
      retry = D - room
    end
  end
  local r = after % P
  local used = (after - r) / P
  if r > 0 then used = used + 1 end
  out[o + 1], out[o + 2], out[o + 3] = retry, B - used, after
  if leaky then out[o + 4] = delay end
  r = after % L
  if r > 0 then return retry == 0, (after - r) / L + 1 end
  return retry == 0, after / L
end

-- A bucket state (token, leaky or GCRA) holding debt D at now. The GCRA's TAT is kept
-- relative to the update (updated + D / L ms), never as an absolute time: that would pass
-- 2^53 when now is near it.
local function debt_state(D, now)
  return {updated = now, debt = D}
end

local function bucket(leaky)
  return {
    fresh = function() return {updated = 0, debt = 0} end,
    parse = function(q, updated, debt)
      if debt > q.B * q.P then return nil end
      return {updated = updated, debt = debt}
    end,
    decide = function(p, st, now, c, out, o)
      return debt_decide(p, debt_now(p, st, now), c, leaky, out, o)
    end,
    -- In place: st (in p's terms, read by this call only) is not used again.
    admitted = function(p, st, now)
      st.updated, st.debt = now, p.after
      return st
    end,
    refund = function(p, st, now, c)
      local D = debt_now(p, st, now) - min(c, p.B) * p.P
      if D < 0 then D = 0 end
      return debt_state(D, now)
    end,
    encode = function(params, st) return format('%s|%d|%d', params, st.updated, st.debt) end,
  }
end

MAKE[1] = function() return bucket(false) end
MAKE[3] = function() return bucket(true) end
