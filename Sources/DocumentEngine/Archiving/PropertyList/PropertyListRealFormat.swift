// Reals in XML property lists: CF writes `<real>` with "%.17g", seventeen significant digits
// where Swift's `description` gives the shortest that round-trip, so they are computed here,
// exactly, with a small big integer.

import Foundation

// MARK: - Real formatting (CF's "%.17g")

/// A small unsigned big integer, enough for exact decimal expansion of a Double.
struct BigNum {
    var limbs: [UInt32]

    init(_ v: UInt64) {
        limbs = [UInt32(truncatingIfNeeded: v), UInt32(truncatingIfNeeded: v >> 32)]
        trim()
    }

    mutating func trim() {
        while let l = limbs.last, l == 0 { limbs.removeLast() }
    }

    mutating func multiply(by m: UInt32) {
        var carry: UInt64 = 0
        for i in limbs.indices {
            let p = UInt64(limbs[i]) * UInt64(m) + carry
            limbs[i] = UInt32(truncatingIfNeeded: p)
            carry = p >> 32
        }
        if carry != 0 { limbs.append(UInt32(truncatingIfNeeded: carry)) }
    }

    mutating func shiftLeft(_ n: Int) {
        guard !limbs.isEmpty, n > 0 else { return }
        let words = n / 32
        let bits = n % 32
        if bits != 0 {
            var carry: UInt32 = 0
            for i in limbs.indices {
                let v = limbs[i]
                limbs[i] = (v << UInt32(bits)) | carry
                carry = v >> UInt32(32 - bits)
            }
            if carry != 0 { limbs.append(carry) }
        }
        if words > 0 { limbs.insert(contentsOf: repeatElement(0, count: words), at: 0) }
    }

    static func compare(_ a: BigNum, _ b: BigNum) -> Int {
        if a.limbs.count != b.limbs.count { return a.limbs.count < b.limbs.count ? -1 : 1 }
        var i = a.limbs.count - 1
        while i >= 0 {
            if a.limbs[i] != b.limbs[i] { return a.limbs[i] < b.limbs[i] ? -1 : 1 }
            i -= 1
        }
        return 0
    }

    /// self -= b, where self >= b.
    mutating func subtract(_ b: BigNum) {
        var borrow: Int64 = 0
        for i in limbs.indices {
            var d = Int64(limbs[i]) - borrow - (i < b.limbs.count ? Int64(b.limbs[i]) : 0)
            if d < 0 {
                d += 1 << 32
                borrow = 1
            } else {
                borrow = 0
            }
            limbs[i] = UInt32(truncatingIfNeeded: d)
        }
        trim()
    }
}

enum RealFormat {
    /// CF's text for a real: "%.17g", except 0 → "0.0" (and -0.0 → "-0.0", where CF loses the
    /// sign), ±inf → "+infinity"/"-infinity", NaN → "nan".
    static func cf(_ d: Double) -> String {
        if d.isNaN { return "nan" }
        if d.isInfinite { return d < 0 ? "-infinity" : "+infinity" }
        // CF writes -0.0 as "0.0" too; the sign is kept here, so that text read back is the
        // same value (CF's reader takes "-0.0").
        if d == 0 { return d.sign == .minus ? "-0.0" : "0.0" }
        let (digits, x) = seventeenDigits(d.magnitude)
        return (d < 0 ? "-" : "") + gFormat(digits, x)
    }

    /// The first 17 significant digits of v (finite, > 0), correctly rounded (ties to even),
    /// and the decimal exponent of the first digit.
    static func seventeenDigits(_ v: Double) -> ([UInt8], Int) {
        let normal = v.exponentBitPattern != 0
        let mantissa = v.significandBitPattern | (normal ? (1 << 52) : 0)
        let e2 = normal ? Int(v.exponentBitPattern) - 1075 : -1074
        var num = BigNum(mantissa)
        var den = BigNum(1)
        if e2 >= 0 { num.shiftLeft(e2) } else { den.shiftLeft(-e2) }
        var x = Int(log10(v).rounded(.down))
        if x >= 0 {
            for _ in 0..<x { den.multiply(by: 10) }
        } else {
            for _ in 0..<(-x) { num.multiply(by: 10) }
        }
        while BigNum.compare(num, den) < 0 {
            num.multiply(by: 10)
            x -= 1
        }
        while true {
            var den10 = den
            den10.multiply(by: 10)
            if BigNum.compare(num, den10) >= 0 {
                den = den10
                x += 1
            } else {
                break
            }
        }
        var digits: [UInt8] = []
        digits.reserveCapacity(17)
        for _ in 0..<17 {
            var d: UInt8 = 0
            while BigNum.compare(num, den) >= 0 {
                num.subtract(den)
                d += 1
            }
            digits.append(d)
            num.multiply(by: 10)
        }
        var half = den
        half.multiply(by: 5)
        let c = BigNum.compare(num, half)
        if c > 0 || (c == 0 && digits[16] & 1 == 1) {
            var i = 16
            while i >= 0 {
                if digits[i] == 9 {
                    digits[i] = 0
                    i -= 1
                } else {
                    digits[i] += 1
                    break
                }
            }
            if i < 0 {
                digits = [1] + [UInt8](repeating: 0, count: 16)
                x += 1
            }
        }
        return (digits, x)
    }

    static func gFormat(_ digits: [UInt8], _ x: Int) -> String {
        func text(_ ds: ArraySlice<UInt8>) -> String { String(decoding: ds.map { $0 + 48 }, as: UTF8.self) }
        var end = digits.count
        while end > 1 && digits[end - 1] == 0 { end -= 1 }
        if x < -4 || x >= 17 {
            var s = text(digits[0..<1])
            if end > 1 { s += "." + text(digits[1..<end]) }
            let ax = x.magnitude
            return s + (x < 0 ? "e-" : "e+") + (ax < 10 ? "0" : "") + String(ax)
        }
        if x >= 0 {
            var s = text(digits[0...x])
            if end > x + 1 { s += "." + text(digits[(x + 1)..<end]) }
            return s
        }
        return "0." + String(repeating: "0", count: -x - 1) + text(digits[0..<end])
    }
}
