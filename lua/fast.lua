-- turnstile: the fast path of check (check.lua) for the common case: a check (not a refund or
-- a reset) of a key with no configuration (no override, no tier; a version alone is fine)
-- under the defaults' policy set, none of them a sliding log, every stored state written
-- under its policy's own parameters. It decides from locals: per policy one GET, one anchored
-- match that compares the state's parameter prefix with the policy's own text and reads its
-- numbers (digits only, so s + 0 reads them in decimal, as nat), the algorithm's arithmetic
-- written straight into the reply, and, when every policy admits a cost above 0, one SET .. PX
-- each. It creates no table but the reply.
--
-- Anything else — a state under other parameters (carried over), a state that is not one,
-- another type at the key — makes fast_check return nil before anything is written, and
-- check takes its general path, which reads the states again and decides (or reports the
-- invalid state) exactly as before. Every decision here is the general path's, step for step
-- (bucket.lua's debt_now and debt_decide, gcra.lua, fixed_window.lua, sliding_window.lua).

-- A set's policy made ready for the fast path (from spec_of): the anchored pattern of its
-- stored state (its parameter text, then exactly its algorithm's count of numbers), its
-- reply's width, and the bounds its states are checked against. A sliding log is not.
local function fast_spec(p)
  if p.alg == 5 then return end
  local pat = '^' .. string.gsub(p.params, '%.', '%%.')
  for _ = 1, p.a.fields do pat = pat .. '|(%d+)' end
  p.pat = pat .. '$'
  p.BP = p.B * p.P
  -- GCRA: the most a state may be ahead (ahead * L + frac <= B * P).
  p.most, p.most_frac = divmod(p.BP, p.L)
  p.leaky = p.alg == 3
end

-- Decides policy p on raw (the state's GET reply: false when absent) at now for cost c,
-- writing its values at out[o + 1 ..]. Returns whether it admits, the TTL its state gets
-- (ttl_of(min_ttl, reset_after)), and the state to store when it admits c > 0 (else nil);
-- or nil when raw is not a state written under p's parameters (the general path decides).
local function fast_decide(p, raw, now, c, min_ttl, out, o)
  local alg, L, P = p.alg, p.L, p.P
  local n1, n2, n3, n4, t = 0, 0, 0, 0, now
  if raw then
    -- An error reply (another type at the key) is a table; a string's .err is nil (its
    -- metatable's index is the string library), without a call of type().
    if raw.err then return nil end
    n1, n2, n3, n4 = match(raw, p.pat)
    if not n1 then return nil end
    n1, n2 = n1 + 0, n2 + 0
    if n1 > MAX_EXACT or n2 > MAX_EXACT then return nil end
    if n1 > now then t = n1 end
  end
  local ok, reset, value
  if alg <= 3 then
    local B, D = p.B, 0
    if alg == 2 then
      if raw then
        -- updated, ahead, frac: 0 <= frac < L, ahead * L + frac <= B * P (gcra.lua's parse).
        n3 = n3 + 0
        local most = p.most
        if n3 >= L or n2 > most or (n2 == most and n3 > p.most_frac) then return nil end
        local elapsed = t - n1
        if elapsed <= n2 then D = (n2 - elapsed) * L + n3 end
      end
    elseif raw then
      -- updated, debt <= B * P. Refilled: 0 once elapsed * L >= debt (a product past 2^53
      -- rounds to a double at least debt, rounding being monotonic: the comparison is exact),
      -- else debt - elapsed * L, below 2^53 and exact.
      if n2 > p.BP then return nil end
      local refill = (t - n1) * L
      if refill < n2 then D = n2 - refill end
    end
    -- bucket.lua's debt_decide on D (at most B * P).
    local retry, after, delay = -1, D, 0
    if c == 0 then
      retry, delay = 0, D
    elseif c <= B then
      local room = (B - c) * P
      if D <= room then
        after = D + c * P
        retry, delay = 0, D
      else
        retry = D - room
      end
    end
    local r = after % P
    local used = (after - r) / P
    if r > 0 then used = used + 1 end
    out[o + 1], out[o + 2], out[o + 3] = retry, B - used, after
    if p.leaky then out[o + 4] = delay end
    r = after % L
    reset = (after - r) / L
    if r > 0 then reset = reset + 1 end
    ok = retry == 0
    if ok and c > 0 then
      if alg == 2 then
        r = after % L
        value = format('%s|%d|%d|%d', p.params, t, (after - r) / L, r)
      else
        value = format('%s|%d|%d', p.params, t, after)
      end
    end
  elseif alg == 4 then
    -- fixed_window.lua: updated, w, n; w the window of updated, n <= L.
    local e = t % P
    local w = (t - e) / P
    local n = 0
    if raw then
      n3 = n3 + 0
      if n3 > MAX_EXACT or n2 ~= (n1 - n1 % P) / P or n3 > L then return nil end
      if n2 == w then n = n3 end
    end
    local retry, k = -1, n
    if c == 0 then
      retry = 0
    elseif c <= L then
      if n <= L - c then
        retry, k = 0, n + c
      else
        retry = P - e
      end
    end
    reset = 0
    if k > 0 then reset = P - e end
    out[o + 1], out[o + 2], out[o + 3] = retry, L - k, reset
    ok = retry == 0
    if ok and c > 0 then value = format('%s|%d|%d|%d', p.params, t, w, k) end
  else
    -- sliding_window.lua: updated, w, cur, prev; w the window of updated, both counts <= L.
    local e = t % P
    local w = (t - e) / P
    local n, m = 0, 0
    if raw then
      n3, n4 = n3 + 0, n4 + 0
      if n3 > MAX_EXACT or n4 > MAX_EXACT or n2 ~= (n1 - n1 % P) / P or n3 > L or n4 > L then
        return nil
      end
      if n2 == w then n, m = n3, n4 elseif n2 + 1 == w then m = n3 end
    end
    local weighted = m * (P - e)
    local rw, rn, rd, k = -1, 0, 1, n
    if c == 0 then
      rw = 0
    elseif c <= L then
      if n + c > L then
        local num = P * (n + c - L)
        rn, rd = num % n, n
        rw = (num - rn) / n + (P - e)
      elseif weighted <= (L - n - c) * P then
        rw, k = 0, n + c
      else
        local num = weighted - (L - n - c) * P
        rn, rd = num % m, m
        rw = (num - rn) / m
      end
    end
    reset = 0
    if k > 0 then reset = 2 * P - e elseif m > 0 then reset = P - e end
    out[o + 1], out[o + 2], out[o + 3] = rw, rn, rd
    out[o + 4], out[o + 5] = sliding_remaining(L, P, weighted, k), reset
    ok = rw == 0 and rn == 0
    if ok and c > 0 then value = format('%s|%d|%d|%d|%d', p.params, t, w, k, m) end
  end
  if reset < min_ttl then reset = min_ttl end
  if reset < 1 then reset = 1 end
  return ok, reset, value
end

-- The reply of a check of set's policies (set.fast: no sliding log) at now for cost, with
-- the key's version, or nil for the general path (nothing written then). width is the
-- reply's length; the reply table is made at (about) its size at once.
local function fast_check(set, base, now, cost, min_ttl, version)
  local width, out = set.width, nil
  -- Redis reads a reply up to its first nil: the slots past width are cut off by one.
  if width == 6 then
    out = {now, version, 0, 0, 0, 0}
  elseif width <= 8 then
    out = {now, version, 0, 0, 0, 0, 0, 0}
    if width < 8 then out[width + 1] = nil end
  else
    out = {now, version, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
    if width < 20 then out[width + 1] = nil end
  end
  local count = #set
  if count == 1 then
    local p = set[1]
    local key = base .. p.suffix
    local ok, ttl, value = fast_decide(p, redis.pcall('GET', key), now, cost, min_ttl, out, 3)
    if ok == nil then return nil end
    if value then redis.call('SET', key, value, 'PX', format('%d', ttl)) end
    return out
  end
  -- Every policy decided first (its key, TTL, state to store and state read kept on its
  -- cached table: fields, no new table); then stored only if all admit.
  local all, o = true, 3
  for i = 1, count do
    local p = set[i]
    local key = base .. p.suffix
    local raw = redis.pcall('GET', key)
    local ok, ttl, value = fast_decide(p, raw, now, cost, min_ttl, out, o)
    if ok == nil then return nil end
    if not ok then all = false end
    p.key, p.raw, p.ok, p.ttl, p.value, p.fo = key, raw, ok, ttl, value, o
    o = o + p.a.width
  end
  if cost > 0 then
    for i = 1, count do
      local p = set[i]
      if all then
        redis.call('SET', p.key, p.value, 'PX', format('%d', p.ttl))
      elseif p.ok then
        -- Denied overall: this policy as if nothing were consumed.
        fast_decide(p, p.raw, now, 0, min_ttl, out, p.fo)
        if p.leaky then out[p.fo + 4] = 0 end
      end
    end
  end
  return out
end
