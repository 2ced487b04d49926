-- turnstile: token bucket (id 1) and leaky bucket (id 3).
--
-- State at KEY: "fp|updated_ms|debt", debt D = (B - x) * P for x tokens held (token bucket)
-- or D = y * P for y units queued (leaky bucket): an integer in units of 1/L ms, relative
-- to updated_ms. A refill over d ms subtracts d * L, capped so the product stays below D.
-- Admit iff D <= (B - c) * P, then D += c * P.

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

local function bucket(leaky)
  return {
    read = function(p, now)
      local s = parse_state(redis.call('GET', p.key), p.fp, 2, p.key)
      if s and s.err then return s end
      if not s then return {updated = 0, debt = 0} end
      local updated, D = s[1], s[2]
      if D > p.B * p.P then D = p.B * p.P end
      return {updated = updated, debt = D}
    end,
    decide = function(p, st, now, c)
      local D = st.debt
      local elapsed = now - st.updated
      if elapsed >= ceildiv(D, p.L) then D = 0 else D = D - elapsed * p.L end
      return debt_decide(p, D, c, leaky)
    end,
    write = function(p, st, now, r, ttl)
      store(p.key, p.fp .. '|' .. int(now) .. '|' .. int(r.after), ttl)
    end,
  }
end

ALG[1] = bucket(false)
ALG[3] = bucket(true)
