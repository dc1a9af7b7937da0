//! Media expiry on both backends: media whose time ran out goes (row, file
//! and thumbnails); media without an expiry, or not yet due, stays.

use super::sparse_tests::app_state;
use super::state_tests::backends;
use crate::media::{self, Method};

fn png(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbImage::from_pixel(width, height, image::Rgb([9, 8, 7]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[tokio::test]
async fn expired_media_is_deleted_with_its_files() {
    for fresh in backends().await {
        let label = fresh.label;
        let data_dir =
            std::env::temp_dir().join(format!("seqline-media-expiry-{}-{label}", std::process::id()));
        std::fs::create_dir_all(&data_dir).unwrap();
        let state = app_state(&fresh.url, &data_dir, i64::MAX).await;
        let server = state.settings.server_name.to_string();
        let image = png(200, 100);
        let mut ids = Vec::new();
        for expires in [Some(1_000), Some(5_000), None] {
            let stored = media::store_new(&state, "@a:sparse.test", Some("image/png"), None, &image, expires);
            ids.push(stored.await.unwrap());
        }
        let (due, later, kept) = (&ids[0], &ids[1], &ids[2]);
        // A thumbnail of the one due, cached beside it.
        media::thumbnail(&state, &server, due, 32, 32, Method::Crop).await.unwrap();
        let files = |id: &str| walk(&data_dir.join("media")).into_iter().filter(|p| p.contains(id)).count();
        assert_eq!(files(due), 2, "{label}: the file and its thumbnail");

        assert_eq!(media::expire(&state, 999).await.unwrap(), 0, "{label}: nothing due yet");
        assert_eq!(media::expire(&state, 1_000).await.unwrap(), 1, "{label}");
        assert!(media::fetch(&state, &server, due).await.is_err(), "{label}: the expired media is gone");
        assert_eq!(files(due), 0, "{label}: with its files");
        for id in [later, kept] {
            assert!(media::fetch(&state, &server, id).await.is_ok(), "{label}: {id} stays");
        }
        assert_eq!(media::expire(&state, i64::MAX).await.unwrap(), 1, "{label}: the later one, in its time");
        assert!(media::fetch(&state, &server, kept).await.is_ok(), "{label}: media without an expiry stays");
        state.db.close().await;
        let _ = std::fs::remove_dir_all(&data_dir);
        fresh.finish().await;
    }
}

/// Every file under `dir`, as path strings.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path.display().to_string());
        }
    }
    out
}
