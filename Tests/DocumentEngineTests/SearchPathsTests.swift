import DocumentEngine
import Foundation
import Testing

/// SB-1, SB-2, XDG-1..XDG-3 (docs/library/apple-behaviours.md).
@Suite struct SearchPathsTests {
    @Test("XDG-3: sandbox folders map onto XDG base directories for the app id")
    func mapping() {
        let paths = SearchPaths(
            appID: "com.example.mystuff",
            environment: [
                "HOME": "/home/ann", "XDG_DATA_HOME": "/data", "XDG_CACHE_HOME": "/cache",
                "XDG_CONFIG_HOME": "/config",
                "XDG_STATE_HOME": "/state", "XDG_RUNTIME_DIR": "/run/user/1000",
                "COM_EXAMPLE_MYSTUFF_BUNDLE_DIR": "/opt/mystuff",
            ])
        #expect(paths.documents.path == "/data/com.example.mystuff/Documents")
        #expect(paths.applicationSupport.path == "/data/com.example.mystuff")
        #expect(paths.caches.path == "/cache/com.example.mystuff")
        #expect(paths.preferences.path == "/config/com.example.mystuff")
        #expect(paths.state.path == "/state/com.example.mystuff")
        #expect(paths.temporary.path == "/run/user/1000/com.example.mystuff")
        #expect(paths.bundle.path == "/opt/mystuff")
    }

    @Test("XDG-1: relative XDG values are ignored; defaults under HOME apply")
    func defaults() {
        let paths = SearchPaths(
            appID: "app", environment: ["HOME": "/home/ann", "XDG_DATA_HOME": "data", "TMPDIR": "/var/tmp"])
        #expect(paths.documents.path == "/home/ann/.local/share/app/Documents")
        #expect(paths.caches.path == "/home/ann/.cache/app")
        #expect(paths.preferences.path == "/home/ann/.config/app")
        #expect(paths.state.path == "/home/ann/.local/state/app")
        #expect(paths.temporary.path == "/var/tmp/app-\(getuid())")
    }

    @Test("SB-2: the seeds' FileManager and NSSearchPathForDirectoriesInDomains look-ups")
    func foundationNames() throws {
        let tmp = try TemporaryDirectory()
        let paths = SearchPaths(appID: "app", environment: ["HOME": tmp.path])
        let documents = try #require(try paths.url(for: .documentDirectory))
        #expect(documents.path == tmp.path + "/.local/share/app/Documents")
        var isDirectory: ObjCBool = false
        #expect(
            FileManager.default.fileExists(atPath: documents.path, isDirectory: &isDirectory)
                && isDirectory.boolValue)
        #expect(try FileFacts(documents.path).permissions == 0o700)
        #expect(try paths.url(for: .cachesDirectory)?.path == tmp.path + "/.cache/app")
        #expect(try paths.url(for: .desktopDirectory) == nil)
        #expect(
            paths.searchPathForDirectories(.documentDirectory, expandTilde: false) == [
                "~/.local/share/app/Documents"
            ])
        #expect(paths.searchPathForDirectories(.documentDirectory) == [documents.path])
        #expect(try paths.url(for: .bundle, create: true) == paths.bundle)
    }
}
