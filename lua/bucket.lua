-- turnstile: token bucket (id 1) and leaky bucket (id 3).
--
-- State at KEY: "alg.L.P.B|updated_ms|debt", debt D = (B - x) * P for x tokens held
-- (token bucket) or D = y * P for y units queued (leaky bucket): an integer in units of
-- 1/L ms, relative to updated_ms. A refill over d ms subtracts d * L, capped so the product
-- stays below D. Admit iff D <= (B - c) * P, then D += c * P.

-- The debt of a bucket state (token, leaky or GCRA, under parameters q) at now.
local function debt_now(q, st, now)
  local max = q.B * q.P
  local D
  if q.alg == 2 then
    if st.tat_ms < now then return 0 end
    local ahead = min(st.tat_ms - now, ceildiv(max, q.L))
    D = ahead * q.L + st.frac
  else
    D = st.debt
    local elapsed = now - st.updated
    if elapsed >= ceildiv(D, q.L) then D = 0 else D = D - elapsed * q.L end
  end
  return min(D, max)
end

-- Shared by the buckets and GCRA: the decision on a debt D (already refilled to now).
local function debt_decide(p, D, c, leaky)
  local L, P, B = p.L, p.P, p.B
  local function remaining(d) return B - ceildiv(d, P) end
  local function queued(d)
    if leaky then return dur(d, L) end
    return ZERO
  end
  if c > B then return result(0, remaining(D), nil, dur(D, L)) end
  if c == 0 then return result(1, remaining(D), ZERO, dur(D, L), queued(D)) end
  local room = (B - c) * P
  if D <= room then
    local after = D + c * P
    local r = result(1, remaining(after), ZERO, dur(after, L), queued(D))
    r.after = after
    return r
  end
  return result(0, remaining(D), dur(D - room, L), dur(D, L))
end

-- A bucket state of policy p holding debt D at now.
local function debt_state(p, D, now)
  if p.alg == 2 then
    local q, f = divmod(D, p.L)
    return {updated = now, tat_ms = now + q, frac = f}
  end
  return {updated = now, debt = D}
end

local function bucket(leaky)
  return {
    fields = 2,
    fresh = function() return {updated = 0, debt = 0} end,
    parse = function(q, n)
      if n[2] > q.B * q.P then return nil end
      return {updated = n[1], debt = n[2]}
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
    encode = function(st) return int(st.updated) .. '|' .. int(st.debt) end,
  }
end

ALG[1] = bucket(false)
ALG[3] = bucket(true)
