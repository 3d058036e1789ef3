// Dates in property lists: the calendar arithmetic behind XML's `<date>` text and the describer's
// dates, shared by the XML writer, the XML reader and the describer.

/// Calendar arithmetic: proleptic Gregorian, astronomical year numbering (year 0 exists),
/// as CF's CFAbsoluteTimeGetGregorianDate.
enum PlistCalendar {
    /// Days from 1970-01-01 to 2001-01-01.
    static let referenceDay: Int64 = 11323

    static func civil(fromDays z0: Int64) -> (year: Int64, month: Int, day: Int) {
        let z = z0 + 719468
        let era = (z >= 0 ? z : z - 146096) / 146097
        let doe = z - era * 146097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (m <= 2 ? 1 : 0), Int(m), Int(d))
    }

    /// Days since 1970-01-01. `y` must be within a few times 10^11.
    static func days(year y0: Int64, month m: Int, day d: Int) -> Int64 {
        let y = m <= 2 ? y0 - 1 : y0
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = Int64(m > 2 ? m - 3 : m + 9)
        let doy = (153 * mp + 2) / 5 + Int64(d) - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }

    static func isLeap(_ y: Int64) -> Bool { (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 }

    static func daysIn(month: Int, year: Int64) -> Int {
        switch month {
        case 2: return isLeap(year) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Dates with |t| below this are written as calendar dates; beyond it (and NaN/inf)
    /// as a real number of seconds (an extension, not CF's format; `XMLReader.date` reads it).
    static let calendarLimit: Double = 2_305_843_009_213_693_952  // 2^61

    struct Parts {
        var year: Int64, month: Int, day: Int, hour: Int, minute: Int, second: Int
        /// Fraction digits after the decimal point ("" for a whole second).
        var fraction: String
    }

    /// Splits a finite date with |t| < calendarLimit into calendar fields plus the
    /// shortest fraction digits that reproduce `t` exactly.
    static func parts(_ t: Double) -> Parts {
        let whole = t.rounded(.down)
        let w = Int64(whole)
        var dayNumber = w / 86400
        var secs = w % 86400
        if secs < 0 {
            secs += 86400
            dayNumber -= 1
        }
        let (y, m, d) = civil(fromDays: dayNumber + referenceDay)
        let s = Int(secs)
        var fraction = ""
        if whole != t { fraction = fractionDigits(t) }
        return Parts(
            year: y, month: m, day: d, hour: s / 3600, minute: (s / 60) % 60, second: s % 60,
            fraction: fraction)
    }

    /// Digits d1...dk such that floor(t) + 0.d1...dk, parsed as a decimal, is exactly t,
    /// with k as small as possible. `t` is finite and not integral.
    static func fractionDigits(_ t: Double) -> String {
        let (_, _, frac) = exactDecimal(t.magnitude.description)
        guard !frac.isEmpty else { return "" }
        return t < 0 ? complement(frac) : frac
    }

    /// 10^k - f for the k-digit string f (whose last digit is not 0), as k digits.
    static func complement(_ f: String) -> String {
        var digits = Array(f.utf8).map { $0 - 48 }
        guard let last = digits.indices.last else { return "" }
        for i in digits.indices { digits[i] = i == last ? 10 - digits[i] : 9 - digits[i] }
        return String(decoding: digits.map { $0 + 48 }, as: UTF8.self)
    }

    /// Expands a Swift float description ("123.45", "1e-05", "1.25e+22") into
    /// integer digits and fraction digits (trailing zeros removed).
    static func exactDecimal(_ s: String) -> (negative: Bool, int: String, frac: String) {
        var chars = Array(s.utf8)
        var negative = false
        if chars.first == UInt8(ascii: "-") {
            negative = true
            chars.removeFirst()
        }
        var exponent = 0
        if let e = chars.firstIndex(where: { $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E") }) {
            exponent = Int(String(decoding: chars[(e + 1)...], as: UTF8.self)) ?? 0
            chars.removeSubrange(e...)
        }
        var digits: [UInt8] = []
        var point = chars.count
        for (i, c) in chars.enumerated() {
            if c == UInt8(ascii: ".") { point = i } else { digits.append(c) }
        }
        if point > digits.count { point = digits.count }
        point += exponent
        var intPart: [UInt8]
        var fracPart: [UInt8]
        if point <= 0 {
            intPart = [UInt8(ascii: "0")]
            fracPart = [UInt8](repeating: UInt8(ascii: "0"), count: -point) + digits
        } else if point >= digits.count {
            intPart = digits + [UInt8](repeating: UInt8(ascii: "0"), count: point - digits.count)
            fracPart = []
        } else {
            intPart = Array(digits[..<point])
            fracPart = Array(digits[point...])
        }
        while fracPart.last == UInt8(ascii: "0") { fracPart.removeLast() }
        while intPart.count > 1 && intPart.first == UInt8(ascii: "0") { intPart.removeFirst() }
        return (negative, String(decoding: intPart, as: UTF8.self), String(decoding: fracPart, as: UTF8.self))
    }

    /// The exact inverse of `parts`: whole seconds `w` since the reference date plus
    /// fraction digits, correctly rounded to a Double.
    static func seconds(whole w: Int64, fraction: String) -> Double? {
        var f = Array(fraction.utf8)
        while f.last == UInt8(ascii: "0") { f.removeLast() }
        if f.isEmpty { return Double(w) }
        let text: String
        if w >= 0 {
            text = "\(w)." + String(decoding: f, as: UTF8.self)
        } else {
            // w + 0.f = -((|w| - 1) + (1 - 0.f))
            text = "-\(w.magnitude - 1)." + complement(String(decoding: f, as: UTF8.self))
        }
        return Double(text)
    }

    static func pad(_ v: Int64, _ width: Int) -> String {
        let s = String(v.magnitude)
        let body = s.count < width ? String(repeating: "0", count: width - s.count) + s : s
        return v < 0 ? "-" + body : body
    }

    /// CF's "%04d" year: at least four characters including the sign.
    static func yearText(_ y: Int64) -> String { y < 0 ? pad(y, 3) : pad(y, 4) }
}
