import Foundation
import Testing

@testable import DocumentEngine

/// The text view of binary property lists (`docfs mount -o archives=xml`, `docfs plist`): the
/// text of an archive, what compiles back, and what is refused with which words.
@Suite struct PropertyListTextTests {
    static func archive() throws -> Data {
        try KeyedArchive.archivedData(withRootObject: ["one", "two"] as NSArray, requiringSecureCoding: true)
    }

    @Test func archiveTextRoundTrips() throws {
        let binary = try Self.archive()
        let text = try #require(PropertyListText(binary: binary))
        #expect(text.kind == .keyedArchive)
        #expect(String(decoding: text.text, as: UTF8.self).contains("<key>$archiver</key>"))
        let again = try PropertyListText.compile(text.text, as: .keyedArchive)
        #expect(try PropertyList.decodeBinary(again) == PropertyList.decodeBinary(binary))
        // An edited text is a valid archive an unarchiver reads.
        let edited = Data(
            String(decoding: text.text, as: UTF8.self).replacingOccurrences(of: ">two<", with: ">three<").utf8
        )
        let compiled = try PropertyListText.compile(edited, as: .keyedArchive)
        let decoded = try KeyedArchive.unarchivedObject(
            ofClasses: [NSArray.self, NSString.self], from: compiled)
        #expect(decoded as? [String] == ["one", "three"])
    }

    /// Found by the fuzzer: a date a hair after the reference date writes a fraction of 150
    /// digits, which the reader refused at 100. The extremes of a Double survive the text.
    @Test func extremeDatesSurviveTheText() throws {
        for seconds in [
            2.8000871530646696e-134, Double.leastNonzeroMagnitude, -Double.leastNonzeroMagnitude, 1e-300,
            -0.5,
        ] {
            let value = PropertyListValue.array([.date(seconds)])
            #expect(try PropertyList.decodeXML(PropertyList.encodeXML(value)) == value, "\(seconds)")
        }
    }

    @Test func notBinaryIsNotShown() {
        #expect(PropertyListText(binary: Data("plain text".utf8)) == nil)
        #expect(PropertyListText(binary: Data("bplist00garbage".utf8)) == nil)
    }

    @Test func refusalsNameLineAndColumnOrTheRule() throws {
        let text = try #require(PropertyListText(binary: try Self.archive()))
        let lines = String(decoding: text.text, as: UTF8.self)
        let broken = Data(lines.replacingOccurrences(of: "<key>$top</key>", with: "<key>$top</kye>").utf8)
        do {
            _ = try PropertyListText.compile(broken, as: .keyedArchive)
            Issue.record("broken text compiled")
        } catch .notAPropertyList(let error) {
            let line = lines.components(separatedBy: "\n").firstIndex { $0.contains("<key>$top</key>") }.map {
                $0 + 1
            }
            #expect(error.line == line, "\(error)")
            #expect(error.column != nil)
            #expect(error.description.hasPrefix("line \(line ?? 0), column"), "\(error)")
        } catch {
            Issue.record("\(error)")
        }
        // A property list that is no longer an archive: refused as an archive, fine as a list.
        let notArchive = Data(
            lines.replacingOccurrences(of: "<key>$objects</key>", with: "<key>$things</key>").utf8)
        #expect(throws: PropertyListTextError.self) {
            try PropertyListText.compile(notArchive, as: .keyedArchive)
        }
        do {
            _ = try PropertyListText.compile(notArchive, as: .keyedArchive)
        } catch .notAnArchive(let reason) {
            #expect(reason.contains("$objects") || reason.contains("$things"), "\(reason)")
        } catch {
            Issue.record("\(error)")
        }
        #expect(PropertyList.isBinary(try PropertyListText.compile(notArchive, as: .propertyList)))
        // A reference out of range is what an unarchiver would trip on.
        let dangling = Data(
            lines.replacingOccurrences(of: "<integer>1</integer>", with: "<integer>999</integer>").utf8)
        #expect(throws: PropertyListTextError.self) {
            try PropertyListText.compile(dangling, as: .keyedArchive)
        }
    }
}
