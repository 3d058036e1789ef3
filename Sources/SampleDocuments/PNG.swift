import Foundation

/// A minimal PNG encoder (8-bit RGB, uncompressed "stored" deflate blocks), so the samples and the
/// demo store hold real images that viewers and thumbnailers open, without an image library.
public enum PNG {
    /// A `width`×`height` image whose pixel at (x, y) is `pixel(x, y)` as (red, green, blue).
    public static func image(width: Int, height: Int, pixel: (Int, Int) -> (UInt8, UInt8, UInt8)) -> Data {
        var raw = Data(capacity: (width * 3 + 1) * height)
        for y in 0..<height {
            raw.append(0)  // filter type: none
            for x in 0..<width {
                let (r, g, b) = pixel(x, y)
                raw.append(contentsOf: [r, g, b])
            }
        }
        var png = Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A])
        var header = Data()
        header.appendBigEndian(UInt32(width))
        header.appendBigEndian(UInt32(height))
        header.append(contentsOf: [8, 2, 0, 0, 0])  // 8-bit, RGB, deflate, no filter, no interlace
        png.appendChunk("IHDR", header)
        png.appendChunk("IDAT", zlibStored(raw))
        png.appendChunk("IEND", Data())
        return png
    }

    /// A gradient tile, different for each `seed`.
    public static func sample(seed: Int, size: Int = 64) -> Data {
        image(width: size, height: size) { x, y in
            (
                UInt8(truncatingIfNeeded: x * 4 + seed * 40), UInt8(truncatingIfNeeded: y * 4 + seed * 70),
                UInt8(truncatingIfNeeded: (x + y) * 2 + seed * 25)
            )
        }
    }

    /// A zlib stream of stored (uncompressed) deflate blocks.
    static func zlibStored(_ data: Data) -> Data {
        var out = Data([0x78, 0x01])
        var offset = 0
        repeat {
            let count = min(65_535, data.count - offset)
            let final: UInt8 = offset + count == data.count ? 1 : 0
            out.append(final)
            out.append(contentsOf: [
                UInt8(count & 0xFF), UInt8(count >> 8), UInt8(~count & 0xFF), UInt8((~count >> 8) & 0xFF),
            ])
            out.append(data[data.startIndex + offset..<data.startIndex + offset + count])
            offset += count
        } while offset < data.count
        var a: UInt32 = 1
        var b: UInt32 = 0
        for byte in data {
            a = (a + UInt32(byte)) % 65_521
            b = (b + a) % 65_521
        }
        out.appendBigEndian(b << 16 | a)
        return out
    }

    static let crcTable: [UInt32] = (0..<256).map { n in
        var c = UInt32(n)
        for _ in 0..<8 { c = c & 1 != 0 ? 0xEDB8_8320 ^ (c >> 1) : c >> 1 }
        return c
    }

    static func crc32(_ data: Data) -> UInt32 {
        var c: UInt32 = 0xFFFF_FFFF
        for byte in data { c = crcTable[Int((c ^ UInt32(byte)) & 0xFF)] ^ (c >> 8) }
        return c ^ 0xFFFF_FFFF
    }
}

extension Data {
    mutating func appendBigEndian(_ value: UInt32) {
        append(contentsOf: [
            UInt8(value >> 24), UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF),
        ])
    }

    mutating func appendChunk(_ type: String, _ body: Data) {
        appendBigEndian(UInt32(body.count))
        let typed = Data(type.utf8) + body
        append(typed)
        appendBigEndian(PNG.crc32(typed))
    }
}
